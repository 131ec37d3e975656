"""The memory plan with the critic's offload switches (critic.model.fsdp_config): its parameters are counted on
the GPU only in the phases that hold them by the workers' rule, its Adam moments only inside its optimizer
step; on CPU nothing moves."""

from __future__ import annotations

import json

import pytest

from tests.trainer.memory_plan_cases import QWEN_3B, plan_of, scale_config
from trainer.memory_plan import misfit_message
from trainer.memory_plan.checks import gib
from trainer.memory_plan.offload_residency import critic_residency
from trainer.memory_plan.setup import plan_setup
from trainer.memory_plan.shape import ModelShape

# The actor keeps its state on the GPU: the differences below are the critic's alone.
PPO = ("algorithm=ppo", "actor_rollout_ref.actor.fsdp_config.param_offload=false",
       "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false")
PARAMS = ("critic.model.fsdp_config.param_offload=true",)
BOTH = (*PARAMS, "critic.model.fsdp_config.optimizer_offload=true")
OTHER_PHASES = ("generate", "old_log_prob", "ref_log_prob", "update_actor")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    """A model folder holding only the Qwen2.5-3B config.json (all the plan reads)."""
    root = tmp_path_factory.mktemp("critic_offload_models") / "3B"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(QWEN_3B))
    return {"3B": str(root)}


def _row(plan, phase: str, moment: str):
    return next(r for g in plan.groups for r in g.rows if r.phase == phase and r.moment == moment)


def _critic_state_bytes() -> tuple[int, int]:
    """The critic's float32 weights and AdamW moments on one GPU."""
    params = ModelShape.from_config(QWEN_3B).total_params("value")
    return 4 * params, 8 * params


def test_the_critics_parameters_are_resident_in_its_own_phases_only(folders):
    kept, offloaded = (plan_of(scale_config(folders["3B"], *PPO, *extra), gib=80) for extra in ((), PARAMS))
    weights, _ = _critic_state_bytes()
    for phase in OTHER_PHASES:
        assert kept.row(phase).parts["weights"] - offloaded.row(phase).parts["weights"] == weights, phase
        assert kept.row(phase).total - offloaded.row(phase).total == weights, phase
    for phase in ("values", "update_critic"):  # the critic brought them: the same rows as without offload
        assert offloaded.row(phase).parts == kept.row(phase).parts, phase
    assert offloaded.peak()[1].total < kept.peak()[1].total


def test_the_critics_optimizer_state_is_on_the_gpu_for_its_step_only(folders):
    # Checkpointed, the critic's backward holds little, so the step with its moments back is the phase's peak.
    checkpointed = (*PPO, "critic.model.enable_gradient_checkpointing=true")
    kept, offloaded = (plan_of(scale_config(folders["3B"], *checkpointed, *extra), gib=80) for extra in ((), BOTH))
    weights, moments = _critic_state_bytes()
    for phase in OTHER_PHASES:
        assert kept.row(phase).parts["optimizer"] - offloaded.row(phase).parts["optimizer"] == moments, phase
    for phase in ("values", "update_critic"):
        before, after = _row(kept, phase, _moment(phase)), _row(offloaded, phase, _moment(phase))
        assert before.parts["optimizer"] - after.parts["optimizer"] == moments, phase
        assert after.parts["weights"] == before.parts["weights"], phase
    step = _row(offloaded, "update_critic", "optimizer step")  # the moments back for the step
    assert step.parts["optimizer"] == _row(kept, "update_critic", "forward/backward").parts["optimizer"]
    assert f"{gib(weights + moments)} per GPU" in " ".join(offloaded.notes)  # page-locked host memory


def _moment(phase: str) -> str:
    return "forward" if phase == "values" else "forward/backward"


def test_on_cpu_the_critics_offload_changes_nothing(folders):
    cpu = ("trainer.device=cpu", *PPO)
    kept, offloaded = (plan_of(scale_config(folders["3B"], *cpu, *extra), gib=None) for extra in ((), BOTH))
    assert [(r.phase, r.moment, r.parts) for g in offloaded.groups for r in g.rows] == [
        (r.phase, r.moment, r.parts) for g in kept.groups for r in g.rows
    ]


def test_the_critics_residency_follows_the_tenants_that_claim_the_gpu(folders):
    """A colocated critic's parameters leave when the actor's process generates or computes and come back for
    its values; a critic with GPUs of its own keeps them once loaded."""
    setup = plan_setup(scale_config(folders["3B"], *PPO, *PARAMS), on_gpu=True)
    colocated = critic_residency(setup, {"actor", "ref", "critic"})
    assert colocated == {"reward_model": False, "old_log_prob": False, "ref_log_prob": False, "values": True,
                         "update_critic": True, "update_actor": False}
    assert all(critic_residency(setup, {"critic"}).values())
    split, kept = (plan_of(scale_config(folders["3B"], *PPO, *extra, "trainer.placement=separate"), gib=80)
                   for extra in (PARAMS, ()))

    def critic_rows(plan) -> list[dict[str, int]]:
        return [r.parts for g in plan.groups if g.name == "critic GPUs" for r in g.rows]

    assert critic_rows(split) and critic_rows(split) == critic_rows(kept)


def test_a_plan_that_does_not_fit_suggests_the_critics_offload_where_it_would_move_something(folders):
    critic_keys = ("critic.model.fsdp_config.param_offload=true", "critic.model.fsdp_config.optimizer_offload=true")
    kept, offloaded, grpo = (plan_of(scale_config(folders["3B"], *extra), gib=40)
                             for extra in (PPO, (*PPO, *BOTH), PPO[1:]))
    assert not kept.fits() and not offloaded.fits() and not grpo.fits()
    assert all(key in misfit_message(kept) for key in critic_keys)
    assert not any(key in misfit_message(message_plan) for message_plan in (offloaded, grpo) for key in critic_keys)
