"""Routing replay through `trainer.main` on the tiny mixture of experts (HF generate rollout, FSDP): R3 replays the
experts the rollout chose in the log-prob pass and every mini-batch of the update, R2 those its log-prob pass
chose. HF generate (prefill, then a token per step with the KV cache) and the packed log-prob forward choose the
same experts in float32, so the two runs train alike, step for step; the update's later mini-batches, run after
the weights moved, report how often the routers would have chosen otherwise."""

import pytest

from tests.e2e.conftest import ONE_RANK, comparable_metrics, run_overrides
from trainer.config_loader import load_config
from trainer.main import run
from trainer.tiny_moe import build_tiny_moe

pytestmark = pytest.mark.slow

STEPS = 2
R3 = ("actor_rollout_ref.actor.router_replay.mode=R3", "actor_rollout_ref.rollout.enable_rollout_routing_replay=true")
# Four optimizer steps per batch of 8 prompts, with pi_old from a log-prob pass before them.
FOUR_STEPS_AFTER_A_PASS = (
    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.old_log_prob_pass=always"
)


def _run(tmp_path, tiny_assets, name: str, *extra: str) -> list[dict]:
    assets = {**tiny_assets, "model": str(build_tiny_moe(tmp_path / "tiny_moe", seed=0))}
    return run(load_config(run_overrides(
        assets, tmp_path / name, "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_at_end=false",
        "data.train_batch_size=8", *extra,
    )))


def test_r3_replays_the_rollouts_experts_and_trains_as_r2(ray_cluster, tiny_assets, tmp_path):
    steps = (ONE_RANK, f"trainer.total_training_steps={STEPS}", *FOUR_STEPS_AFTER_A_PASS)
    r3 = _run(tmp_path, tiny_assets, "r3", *steps, *R3)
    r2 = _run(tmp_path, tiny_assets, "r2", *steps, "actor_rollout_ref.actor.router_replay.mode=R2")
    assert len(r3) == len(r2) == STEPS
    # The log-prob pass replayed the rollout's experts, and its own router agreed with every one of them.
    assert [record["router_replay/mismatch_log_prob"] for record in r3] == [0.0] * STEPS
    assert all("router_replay/mismatch_log_prob" not in record for record in r2)  # R2 records there, compares nothing
    for history in (r3, r2):
        assert all(0.0 < record["router_replay/mismatch_update"] < 1.0 for record in history), history
    # Alike up to rounding: R2 also replays each response's last token, which the rollout never ran (R3 routes it
    # live); no log-prob depends on its experts, but the grouped expert products' row counts change with them.
    for a, b in zip(*(comparable_metrics(history) for history in (r3, r2))):
        assert a.pop("router_replay/mismatch_update") == pytest.approx(b.pop("router_replay/mismatch_update"), abs=0.01)
        a.pop("router_replay/mismatch_log_prob")
        assert a == pytest.approx(b, rel=1e-5, abs=1e-9), (a, b)


def test_r3_replays_in_a_checkpointed_update_that_gives_pi_old(ray_cluster, tiny_assets, tmp_path):
    # One optimizer step per batch: no log-prob pass (the update's own forward gives pi_old), so the first replayed
    # forward is a training forward whose checkpointed layers route again in the backward.
    (record,) = _run(
        tmp_path, tiny_assets, "run", ONE_RANK, "trainer.total_training_steps=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        *R3,
    )
    assert "router_replay/mismatch_log_prob" not in record  # no log-prob pass ran
    # Before any optimizer step the trainer's routers choose what HF generate's did, token for token.
    assert record["router_replay/mismatch_update"] == 0.0
    assert record["actor/grad_norm"] > 0


def test_each_ulysses_rank_replays_its_shard_of_the_rollouts_experts(ray_cluster, tiny_assets, tmp_path):
    # Two ranks share each packed row (Ulysses): each routes its contiguous shard of the row, and replays that shard
    # of the rollout's table. A shard mapped to the wrong tokens would disagree with the trainer's own choices.
    (record,) = _run(
        tmp_path, tiny_assets, "run", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=1",
        *FOUR_STEPS_AFTER_A_PASS, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", *R3,
    )
    assert record["router_replay/mismatch_log_prob"] == 0.0
    assert 0.0 < record["router_replay/mismatch_update"] < 1.0


def test_r3_replays_the_experts_of_a_multi_turn_rollout(ray_cluster, tiny_assets, tmp_path):
    # The tool task's agent loop on HF generate: each turn records the experts of the whole conversation so far, and
    # the batch's table is the latest turn's; the log-prob pass over prompt, model and tool tokens agrees with it.
    from trainer.datasets.synthetic import write_synthetic_dataset

    data = tmp_path / "data_tool_vault"
    write_synthetic_dataset(str(data), tasks=("tool_vault",), seed=0)
    assets = {**tiny_assets, "train": str(data / "train.parquet"), "val": str(data / "val.parquet")}
    history = _run(
        tmp_path, assets, "run", "task=tool_vault", ONE_RANK, f"trainer.total_training_steps={STEPS}",
        *FOUR_STEPS_AFTER_A_PASS, *R3,
    )
    assert [record["router_replay/mismatch_log_prob"] for record in history] == [0.0] * STEPS
    assert all(0.0 < record["router_replay/mismatch_update"] < 1.0 for record in history)
