"""trainer.n_gpus_per_node=auto (the default) is one worker per GPU this node shows and 2 CPU workers without a
GPU, resolved once by the config loader; a local GPU run asking for more GPUs than the node shows stops before
Ray with one `error:` line (exit code 2). Every settings check runs before the "nothing to train" decision, so
a finished run with a mistake in its settings reports the mistake, and only a valid one says nothing to train.

This machine has no GPU: the count is replaced (`fake_gpus`), or read from a stand-in `nvidia-smi`."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.conftest import error_lines, short_run
from trainer import checkpointing, run_setup
from trainer.config_loader import load_config
from trainer.input_errors import InputError
from trainer.main import main
from trainer.preflight import check_local_gpus
from trainer.recipe_runner import find_recipe, load_recipe_config

FIX = ("lower trainer.n_gpus_per_node (auto: one worker per GPU shown), make more GPUs visible, or set RAY_ADDRESS to "
       "attach to a Ray cluster that has them")


@pytest.fixture
def fake_gpus(monkeypatch) -> Callable[[int], None]:
    """`fake_gpus(n)`: this node shows n GPUs. The run starts its own cluster (RAY_ADDRESS unset, and the test
    session's Ray, when up in this process, is not taken for the run's)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(run_setup, "ray_running_here", lambda: False)
    return lambda count: monkeypatch.setattr(run_setup, "visible_gpu_count", lambda: count)


@pytest.mark.parametrize(("gpus", "device", "expected"), [
    (0, "auto", 2), (1, "auto", 1), (4, "auto", 4), (4, "cuda", 4), (4, "cpu", 2), (0, "cuda", 2),
])
def test_auto_is_the_gpus_shown_or_two_cpu_workers(fake_gpus, gpus, device, expected):
    fake_gpus(gpus)
    assert load_config([f"trainer.device={device}"]).trainer.n_gpus_per_node == expected


def test_an_explicit_count_is_kept(fake_gpus):
    fake_gpus(1)
    assert load_config(["trainer.n_gpus_per_node=3"]).trainer.n_gpus_per_node == 3


def test_cfg_job_and_recipes_see_the_resolved_count(fake_gpus, capsys):
    fake_gpus(4)
    assert main(["--cfg", "job"]) == 0
    assert "  n_gpus_per_node: 4\n" in capsys.readouterr().out
    assert load_recipe_config(find_recipe("raft")).trainer.n_gpus_per_node == 4


@pytest.fixture
def four_gpu_smi(tmp_path, monkeypatch) -> Iterator[None]:
    """An `nvidia-smi` listing 4 GPUs first on PATH, and no NVML bindings (the count then comes from the tool)."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    yield


@pytest.mark.parametrize(("visible", "expected"), [(None, 4), ("1,3", 2), ("", 0)])
def test_the_count_is_what_cuda_visible_devices_leaves(four_gpu_smi, monkeypatch, visible, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert run_setup.visible_gpu_count() == expected
    assert load_config([]).trainer.n_gpus_per_node == (expected or 2)


def test_more_gpus_than_the_node_shows_stop_before_ray(no_ray, fake_gpus, small_assets, tmp_path, capsys):
    fake_gpus(1)
    assert main(short_run(small_assets, tmp_path, "trainer.n_gpus_per_node=3")) == 2
    assert error_lines(capsys) == [
        f"error: trainer.n_gpus_per_node=3 asks for 3 GPUs per node, but this node shows 1 (CUDA_VISIBLE_DEVICES unset); {FIX}"
    ]


def test_what_the_local_count_leaves_alone(fake_gpus, monkeypatch):
    fake_gpus(1)
    check_local_gpus(load_config(["trainer.n_gpus_per_node=1"]))
    check_local_gpus(load_config(["trainer.n_gpus_per_node=3", "trainer.device=cpu"]))  # CPU workers
    fake_gpus(0)
    check_local_gpus(load_config(["trainer.n_gpus_per_node=3"]))  # device=auto without a GPU: CPU workers
    fake_gpus(2)
    two_nodes = load_config(["trainer.nnodes=2", "trainer.n_gpus_per_node=2"])
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # attaching: this node is not the cluster
    check_local_gpus(two_nodes)
    monkeypatch.delenv("RAY_ADDRESS")
    # A local cluster is this node alone: both pool nodes of trainer.nnodes=2 land on it.
    with pytest.raises(InputError, match=r"trainer.n_gpus_per_node=2 asks for 4 GPUs on this node .* but this node shows 2"):
        check_local_gpus(two_nodes)


# A run whose checkpoint is at step 3 of trainer.total_training_steps=3: nothing left to train.
FINISHED = ("trainer.total_training_steps=3",)


@pytest.fixture
def finished_run(tmp_path) -> Path:
    """A run folder whose checkpoint is at the last step (a fake checkpoint: no training run needed)."""
    checkpointing.save_checkpoint(tmp_path, 3, {"global_step": 3, "dataloader": {}}, lambda folder: None)
    return tmp_path


@pytest.mark.parametrize(("gpus", "override", "expected"), [
    (1, "trainer.n_gpus_per_node=3",
     f"error: trainer.n_gpus_per_node=3 asks for 3 GPUs per node, but this node shows 1 (CUDA_VISIBLE_DEVICES unset); {FIX}"),
    (0, "trainer.n_gpus_per_node=3",
     "error: actor_rollout_ref.actor.ppo_mini_batch_size=8 prompts × actor_rollout_ref.rollout.n=8 = 64 responses per "
     "mini-batch do not split over trainer.n_gpus_per_node=3 × trainer.nnodes=1 = 3 workers"),
    (0, "actor_rollout_ref.rollout.temperature=hot",
     "error: config key 'actor_rollout_ref.rollout.temperature' must be a float > 0, got 'hot'"),
], ids=["more_gpus_than_shown", "batch_split", "worker_setting"])
def test_a_finished_run_with_a_bad_setting_reports_it(
    no_ray, fake_gpus, small_assets, finished_run, capsys, gpus, override, expected
):
    fake_gpus(gpus)
    assert main(short_run(small_assets, finished_run, *FINISHED, override)) == 2
    err = capsys.readouterr().err
    assert "nothing to train" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(expected), err


def test_a_finished_run_with_a_dead_ray_address_reports_it(no_ray, fake_gpus, small_assets, finished_run, capsys, monkeypatch):
    with socket.socket() as held:  # bound, never listening: connections are refused for the whole test
        held.bind(("", 0))
        port = held.getsockname()[1]
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
        assert main(short_run(small_assets, finished_run, *FINISHED, "trainer.ray_connect_timeout_s=0.5")) == 2
    err = capsys.readouterr().err
    assert "nothing to train" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: no Ray cluster answered at RAY_ADDRESS=127.0.0.1:{port}"), err


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_finished_run_with_valid_settings_has_nothing_to_train(no_ray, fake_gpus, small_assets, finished_run, capsys, gpus):
    fake_gpus(gpus)
    assert main(short_run(small_assets, finished_run, *FINISHED)) == 0
    err = capsys.readouterr().err
    assert not [line for line in err.splitlines() if line.startswith("error:")], err
    assert f"nothing to train: the checkpoint {finished_run / 'global_step_3'} is at step 3" in err
