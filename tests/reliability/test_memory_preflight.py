"""The memory preflight on the command line: `trainer.plan_only=true` prints the plan and exits 0 without
Ray; on a GPU run a plan that does not fit is one `error:` line (exit 2) before Ray starts, a warning with
`trainer.memory_check=warn`, nothing with `off`; CPU runs are not checked."""

from __future__ import annotations

import json

import pytest

from tests.reliability.conftest import short_run
from trainer.main import main

QWEN_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False)


def test_plan_only_prints_the_plan_from_a_config_json_alone(no_ray, small_assets, tmp_path, capsys):
    folder = tmp_path / "qwen7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_7B))  # no weights, no tokenizer: the plan needs neither
    args = short_run({**small_assets, "model": str(folder)}, tmp_path / "run", "trainer.plan_only=true",
                     "trainer.gpu_memory_gib=139.8", "trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.name=vllm")
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory plan per GPU, GiB (GPU memory: 139.8 GiB, trainer.gpu_memory_gib)")
    assert "trainer GPUs (8):" in out and "update_actor" in out and "\nfits: peak " in out
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_plan_only_names_a_folder_without_config_json(no_ray, small_assets, tmp_path, capsys):
    args = short_run({**small_assets, "model": str(tmp_path)}, tmp_path / "run", "trainer.plan_only=true")
    assert main(args) == 2
    (line,) = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert line == f"error: actor_rollout_ref.model.path='{tmp_path}' has no config.json (the memory plan reads the model's shape from it)"


@pytest.fixture
def node_with_gpus(monkeypatch):
    """The driver's node shows two GPUs, so the local GPU count passes and the memory plan is what is checked."""
    from trainer import run_setup

    monkeypatch.setattr(run_setup, "visible_gpu_count", lambda: 2)


def gpu_run(small_assets, tmp_path, *extra: str) -> list[str]:
    """A GPU run (as the driver sees it) of the tiny model on GPUs of 0.5 GiB: its plan cannot fit."""
    return short_run(small_assets, tmp_path, "trainer.device=cuda", "trainer.gpu_memory_gib=0.5", *extra)


def test_a_gpu_run_whose_plan_does_not_fit_stops_with_one_error_line(no_ray, node_with_gpus, small_assets, tmp_path, capsys):
    assert main(gpu_run(small_assets, tmp_path)) == 2
    captured = capsys.readouterr()
    errors = [l for l in captured.err.splitlines() if l.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: memory plan: trainer GPUs, ") and "needs 2.0 GiB per GPU but the GPU has 0.5 GiB" in errors[0]
    assert errors[0].endswith("trainer.plan_only=true prints the plan, trainer.memory_check=warn runs anyway")
    assert "memory plan: does not fit: peak 2.0 GiB of 0.5 GiB per GPU" in captured.out


def test_memory_check_warn_goes_on_and_off_does_not_check(no_ray, node_with_gpus, small_assets, tmp_path, capsys):
    with pytest.raises(AssertionError, match="Ray was started"):  # past the checks
        main(gpu_run(small_assets, tmp_path, "trainer.memory_check=warn"))
    warnings = [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning: memory plan:")]
    assert len(warnings) == 1
    with pytest.raises(AssertionError, match="Ray was started"):
        main(gpu_run(small_assets, tmp_path, "trainer.memory_check=off"))
    captured = capsys.readouterr()
    assert "memory plan" not in captured.out + captured.err


def test_cpu_runs_are_not_checked(no_ray, small_assets, tmp_path, capsys):
    with pytest.raises(AssertionError, match="Ray was started"):
        main(short_run(small_assets, tmp_path, "trainer.device=cpu", "trainer.gpu_memory_gib=0.5"))
    assert "memory plan" not in capsys.readouterr().out
