"""The memory plan with verl's Megatron offload switches (actor_rollout_ref.actor.megatron.*_offload,
ref.megatron.param_offload, critic.megatron.*_offload): the weights are counted on the GPU in the phases that
hold them by the workers' rule, the float32 gradient buffers only from the update on, the optimizer's state only
inside its step; a plan that does not fit names the Megatron switches."""

from __future__ import annotations

import pytest

from tests.trainer.memory_plan_cases import part, plan_of, scale_config
from trainer.memory_plan import misfit_message
from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.residency import role_memory
from trainer.memory_plan.setup import plan_setup

MEGATRON = "actor_rollout_ref.actor.strategy=megatron"
FSDP_KEPT = ("actor_rollout_ref.actor.fsdp_config.param_offload=false",
             "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false")
SWITCHES = tuple(
    f"actor_rollout_ref.actor.megatron.{k}=true" for k in ("param_offload", "grad_offload", "optimizer_offload")
)


def _megatron(folder: str, *extra: str, on_gpu: bool = True):
    cfg = scale_config(folder, MEGATRON, *FSDP_KEPT, *extra)
    return cfg if on_gpu else scale_config(folder, MEGATRON, *FSDP_KEPT, "trainer.device=cpu", *extra)


def test_the_gradient_buffers_come_for_the_update_and_leave_for_generation(folders):
    kept, moved = plan_of(_megatron(folders["3B"])), plan_of(_megatron(folders["3B"], *SWITCHES))
    setup = plan_setup(_megatron(folders["3B"], *SWITCHES), on_gpu=True)
    assert (setup.actor.param_offload, setup.actor.grad_offload, setup.actor.optimizer_offload) == (True, True, True)
    assert setup.ref.param_offload  # the reference follows the actor's switch
    memory = role_memory(setup.actor, setup.gpus_per_pool)
    grads = memory.grads / GIB
    for phase in ("generate", "old_log_prob", "ref_log_prob"):
        assert part(kept, phase, "grads") == pytest.approx(grads)
        assert part(moved, phase, "grads") == 0.0, phase
        assert part(moved, phase, "optimizer") == 0.0, phase
    assert part(moved, "update_actor", "grads") == pytest.approx(grads)
    # the hybrid engine's sync: the actor's weights in, the reference out, nothing else
    assert part(moved, "generate", "weights") == pytest.approx(memory.weights / GIB)
    assert part(kept, "generate", "weights") == pytest.approx(2 * memory.weights / GIB)
    assert moved.peak()[1].total < kept.peak()[1].total
    assert "page-locked host memory for the offloaded state" in " ".join(moved.notes)


def test_on_cpu_the_switches_change_nothing(folders):
    kept = plan_of(_megatron(folders["3B"], on_gpu=False))
    moved = plan_of(_megatron(folders["3B"], *SWITCHES, on_gpu=False))
    assert [row.parts for row in moved.groups[0].rows] == [row.parts for row in kept.groups[0].rows]


def test_a_megatron_plan_that_does_not_fit_names_the_megatron_switches(folders):
    plan = plan_of(_megatron(folders["7B"], "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"), gib=100)
    assert plan.fits() is False and plan.problems == []  # the engine starts; the step's peak does not fit
    message = misfit_message(plan)
    assert "actor_rollout_ref.actor.megatron." in message
    assert "fsdp_config" not in message and "lora_rank" not in message
    utilization = "actor_rollout_ref.rollout.gpu_memory_utilization=0.5"
    fsdp = misfit_message(plan_of(scale_config(folders["7B"], *FSDP_KEPT, utilization), gib=60))
    assert "megatron" not in fsdp
