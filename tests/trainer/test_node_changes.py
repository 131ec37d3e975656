"""trainer.on_node_loss / on_node_join without a cluster: the settings' checks, the size a run goes on with after
a loss and its batch re-check, and a checkpoint read by more ranks than saved it (a run grown back)."""

from __future__ import annotations

import time

import pytest
import ray
import torch

from single_controller.ray.node_loss import LostNode
from tests.reliability.conftest import error_lines, short_run, small_assets  # noqa: F401 - the fixture
from trainer.config_loader import load_config
from trainer.input_errors import InputError
from trainer.main import main
from trainer.node_changes import config_on_nodes, free_pool_nodes, pool_nodes_of
from trainer.node_policy import node_policy_problem
from trainer.run_setup import settle_device_on_cluster
from workers.fsdp.checkpoint import _extra_state_file, extra_state_path

# 8 prompts x 8 responses per mini-batch: they split over 8 workers (4 nodes of 2) and over 4, not over 6.
FOUR_NODES = ("trainer.nnodes=4", "trainer.n_gpus_per_node=2", "trainer.on_node_loss=continue")


def test_grow_without_continue_is_refused_before_ray(no_ray, small_assets, tmp_path, capsys):
    assert main(short_run(small_assets, tmp_path, "trainer.on_node_join=grow")) == 2
    assert error_lines(capsys) == [
        "error: trainer.on_node_join=grow takes back nodes that a run lost and went on without, which needs "
        "trainer.on_node_loss=continue (it is 'stop': the run ends at the first lost node); set both, or "
        "trainer.on_node_join=ignore"
    ]


def test_an_unknown_policy_names_the_valid_ones(no_ray, small_assets, tmp_path, capsys):
    assert main(short_run(small_assets, tmp_path, "trainer.on_node_loss=restart")) == 2
    assert error_lines(capsys) == ["error: trainer.on_node_loss='restart' is not valid; choose one of ['stop', 'continue']"]


def test_the_run_goes_on_with_fewer_nodes_from_the_newest_checkpoint(small_assets, tmp_path):
    cfg = load_config(short_run(small_assets, tmp_path, *FOUR_NODES, "trainer.resume_mode=disable"))
    smaller = config_on_nodes(cfg, 2)
    assert (smaller.trainer.nnodes, smaller.trainer.resume_mode) == (2, "auto")
    assert (cfg.trainer.nnodes, cfg.trainer.resume_mode) == (4, "disable")  # the run's own config is left as it was


def test_a_batch_that_does_not_split_over_the_nodes_left_stops_with_one_line(small_assets, tmp_path):
    cfg = load_config(short_run(small_assets, tmp_path, *FOUR_NODES))
    with pytest.raises(InputError) as raised:
        config_on_nodes(cfg, 3)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        "cannot go on with trainer.nnodes=3: actor_rollout_ref.actor.ppo_mini_batch_size=8 prompts "
        "× actor_rollout_ref.rollout.n=8 = 64 responses per mini-batch do not split over trainer.n_gpus_per_node=2 × "
        "trainer.nnodes=3 = 6 workers"
    ), message
    assert message.endswith("The last whole checkpoint is kept: resume it with settings that fit the nodes left")
    with pytest.raises(InputError, match="nothing is left to continue on"):
        config_on_nodes(cfg, 0)


def test_lost_ranks_count_in_pool_nodes():
    lost = [LostNode("a", "10.0.0.1", "", (2, 3)), LostNode("b", "10.0.0.2", "", (6, 7))]
    cfg = load_config(["trainer.n_gpus_per_node=2"])
    assert pool_nodes_of(lost, cfg) == 2
    assert pool_nodes_of([], cfg) == 0
    # Two pool nodes that Ray packed onto one big node: losing it loses both.
    assert pool_nodes_of([LostNode("a", "10.0.0.1", "", (0, 1, 2, 3))], cfg) == 2


def test_more_ranks_than_saved_read_the_saved_ranks_extra_state_in_turn(tmp_path):
    for rank in range(2):
        torch.save({"rank": rank}, extra_state_path(str(tmp_path), rank))
    read = [torch.load(_extra_state_file(str(tmp_path), rank), weights_only=True)["rank"] for rank in range(4)]
    assert read == [0, 1, 0, 1]
    with pytest.raises(FileNotFoundError, match="holds no extra_state_rank"):
        _extra_state_file(str(tmp_path / "empty"), 0)


def test_an_attached_driver_decides_auto_by_the_clusters_gpus(ray_cluster):
    """device=auto follows the cluster the driver attached to (here CPU only), an explicit device stays."""
    auto, explicit = load_config(["trainer.device=auto"]), load_config(["trainer.device=cuda"])
    settle_device_on_cluster(auto)
    settle_device_on_cluster(explicit)
    assert (auto.trainer.device, explicit.trainer.device) == ("cpu", "cuda")


def test_free_pool_nodes_counts_what_the_cluster_can_reserve_now(ray_cluster):
    """The session's one-node CPU cluster: pool nodes of 1 CPU fit (at most as many as asked for), a pool node of
    more CPUs than the whole cluster has does not; the probes are given back."""
    before = ray.available_resources().get("CPU", 0)
    small = load_config(["trainer.device=cpu", "trainer.n_gpus_per_node=1"])
    assert free_pool_nodes(small, 2) == 2
    huge = load_config(["trainer.device=cpu", f"trainer.n_gpus_per_node={int(ray.cluster_resources()['CPU']) + 1}"])
    assert free_pool_nodes(huge, 1) == 0
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) >= before


def test_continue_is_accepted_with_megatrons_distributed_optimizer(no_ray, small_assets, tmp_path):
    """Its checkpoint is read back at any data-parallel size (tests/megatron/test_megatron_checkpoint.py)."""
    megatron = ("trainer.on_node_loss=continue", "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true")
    assert node_policy_problem(load_config(short_run(small_assets, tmp_path, *megatron))) is None
