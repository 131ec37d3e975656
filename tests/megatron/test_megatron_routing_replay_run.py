"""Routing replay through `trainer.main` with the Megatron actor on the tiny mixture of experts (CPU over gloo, the
HF rollout replica): R3 replays the experts the replica's generate chose, each pipeline stage its own layers' (and
each recomputed layer again in the backward); R2
replays those its log-prob pass chose, with the experts split over two ranks. Before the first optimizer step the
trainer's routers choose as the recording did, token for token; the update's later mini-batches, run after the
weights moved, report how often they would have chosen otherwise."""

import pytest

from tests.e2e.conftest import run_overrides
from trainer.config_loader import load_config
from trainer.main import run
from trainer.tiny_moe import build_tiny_moe

pytest.importorskip("megatron.core", reason="install the [megatron] extra")
pytestmark = pytest.mark.slow

MEGATRON = ("actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=2")
# Four optimizer steps on 8 prompts, with pi_old from a log-prob pass before them.
FOUR_STEPS_AFTER_A_PASS = (
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.old_log_prob_pass=always"
)


def _run(tmp_path, tiny_assets, name: str, *extra: str) -> dict:
    assets = {**tiny_assets, "model": str(build_tiny_moe(tmp_path / "tiny_moe", seed=0))}
    (record,) = run(load_config(run_overrides(
        assets, tmp_path / name, "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_at_end=false",
        "data.train_batch_size=8", "trainer.total_training_steps=1", *MEGATRON, *FOUR_STEPS_AFTER_A_PASS, *extra,
    )))
    return record


def test_megatron_replays_the_rollouts_experts_per_stage_and_its_own_over_expert_ranks(ray_cluster, tiny_assets,
                                                                                       tmp_path):
    # With recomputed layers: each router replays in the backward what its forward did.
    r3 = _run(
        tmp_path, tiny_assets, "r3", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.actor.router_replay.mode=R3", "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    )
    # The log-prob pass replayed the replica's experts (prefill, then a token per step), and agreed with every one.
    assert r3["router_replay/mismatch_log_prob"] == 0.0
    assert 0.0 < r3["router_replay/mismatch_update"] < 1.0
    r2 = _run(
        tmp_path, tiny_assets, "r2", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
        "actor_rollout_ref.actor.router_replay.mode=R2",
    )
    assert "router_replay/mismatch_log_prob" not in r2  # R2's log-prob pass records, compares nothing
    assert 0.0 < r2["router_replay/mismatch_update"] < 1.0
    assert r2["actor/grad_norm"] > 0


def test_megatron_runs_the_multi_turn_agent_loop_and_replays_its_experts(ray_cluster, tiny_assets, tmp_path):
    # The tool task on the Megatron actor: each rank's HF replica runs its conversations through the agent loop, each
    # turn recording the experts of the conversation so far; the log-prob pass agrees with the latest turn's choices.
    # (The random tiny model ends its conversations in one turn here: tests/rollout/test_agent_loop.py scripts the
    # tool calls of several turns, on the same agent loop.)
    from trainer.datasets.synthetic import write_synthetic_dataset

    data = tmp_path / "data_tool_vault"
    write_synthetic_dataset(str(data), tasks=("tool_vault",), seed=0)
    assets = {**tiny_assets, "train": str(data / "train.parquet"), "val": str(data / "val.parquet")}
    record = _run(
        tmp_path, assets, "agent", "task=tool_vault", "actor_rollout_ref.actor.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
    )
    assert record["agent/turns_mean"] >= 1.0  # the agent loop built the batch
    assert record["router_replay/mismatch_log_prob"] == 0.0
    assert 0.0 < record["router_replay/mismatch_update"] < 1.0
