"""The memory plan with hybrid sharding (fsdp_config.fsdp_size below the ranks): a model's state spreads over its
shard group, not the whole pool."""

import json

import pytest

from tests.trainer.test_memory_plan_hybrid_tp import QWEN_7B
from trainer.config_loader import load_config
from trainer.memory_plan import build_plan


@pytest.mark.parametrize("section", ["actor_rollout_ref.actor", "critic.model"])
def test_a_model_sharded_within_groups_holds_a_groups_share_of_its_state(tmp_path, section):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_7B))

    def update_row(fsdp_size):
        # The critic with GPUs of its own (trainer.placement=separate): each group holds one trained model.
        cfg = load_config([f"actor_rollout_ref.model.path={tmp_path}", "algorithm.adv_estimator=gae",
                           "trainer.placement=separate", "trainer.n_gpus_per_node=8",
                           f"{section}.fsdp_config.fsdp_size={fsdp_size}"])
        plan = build_plan(cfg, gpu_bytes=140 << 30, gpu_source="test")
        role = "actor" if section.startswith("actor") else "critic"
        group = next(group for group in plan.groups if group.name == f"{role} GPUs")
        return next(row for row in group.rows if row.phase == f"update_{role}" and row.moment == "forward/backward")

    over_all, in_fours = update_row(-1), update_row(4)
    assert in_fours.parts["optimizer"] == pytest.approx(2 * over_all.parts["optimizer"], rel=1e-6)
    assert in_fours.parts["grads"] > over_all.parts["grads"]
    assert update_row(8).parts == over_all.parts  # a group of every rank is plain FSDP
