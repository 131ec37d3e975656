"""Where a trained model's parameters are during each phase of a step, with parameter offload: the workers' rule
(workers/fsdp/residency.py) replayed over the phases, for the memory plan's rows (trainer/memory_plan/plan.py)."""

from __future__ import annotations

from trainer.memory_plan.setup import PlanSetup

# The phases of a step after generation, in the order the trainer runs them (trainer/ppo_trainer.py: the reward
# model scores the rollout before the log-probs).
STEP_PHASES = ("reward_model", "old_log_prob", "ref_log_prob", "values", "update_critic", "update_actor")


def actor_residency(setup: PlanSetup, on_this_gpu: set[str]) -> dict[str, bool]:
    """Whether the actor's parameters are on the GPU while each phase of `STEP_PHASES` computes (with
    param_offload; without it they never leave), by the workers' rule (workers/fsdp/residency.py): a phase
    that computes with the actor brings them and they stay; another tenant of the process claiming the GPU
    sends them to the host (the hybrid engine once its weight sync read them, a colocated critic or reward
    model); a separate reference's pass moves none of the actor's state. So with the old log-prob pass
    skipped (trainer/old_log_prob_pass.py) a separate reference computes while the actor's parameters are
    still on the host from generation, and they come back for the update; with LoRA the reference is the
    actor itself (adapters off), which brings them."""
    rollout = setup.rollout
    # After generation: on the host if the hybrid engine claimed the GPU, else on it (HF generate computes with
    # the actor; a separate engine's weight broadcast reads the actor, and the engine's process claims nothing here).
    resident = not (rollout.name == "vllm" and rollout.placement == "hybrid")
    # Per phase: True, it computes with the actor; False, another tenant claims the GPU; None, nothing moves.
    moves: dict[str, bool | None] = {
        "reward_model": False if "reward_model" in on_this_gpu else None,
        "old_log_prob": True if setup.old_log_prob is not None else None,
        "ref_log_prob": True if setup.lora_reference else None,
        "values": False if "critic" in on_this_gpu else None,
        "update_critic": False if "critic" in on_this_gpu else None,
        "update_actor": True,
    }
    return _carried(moves, resident)


def _carried(moves: dict[str, bool | None], resident: bool) -> dict[str, bool]:
    """Residency per phase of `STEP_PHASES`: each phase's move (True / False), or where the last one left it (None)."""
    residency: dict[str, bool] = {}
    for phase in STEP_PHASES:
        if moves[phase] is not None:
            resident = moves[phase]
        residency[phase] = resident
    return residency


def critic_residency(setup: PlanSetup, on_this_gpu: set[str]) -> dict[str, bool]:
    """Whether the critic's parameters are on the GPU while each phase of `STEP_PHASES` computes (with its
    param_offload; without it they never leave), by the actor's rule (workers/fsdp/residency.py
    `Residency`): its own phases bring them and they stay until another tenant of the process claims the
    GPU: the actor's generation and every phase computing with the actor, or a colocated reward model; a
    separate reference's pass claims nothing. A critic with GPUs of its own keeps them once loaded."""
    actor_here = "actor" in on_this_gpu
    # After generation: on the host where the actor's process generated (its last update claimed the GPU too).
    resident = not actor_here
    # Per phase: True, the critic computes; False, another tenant claims the GPU; None, nothing moves.
    moves: dict[str, bool | None] = {
        "reward_model": False if "reward_model" in on_this_gpu else None,
        "old_log_prob": False if actor_here and setup.old_log_prob is not None else None,
        "ref_log_prob": False if actor_here and setup.lora_reference else None,
        "values": True,
        "update_critic": True,
        "update_actor": False if actor_here else None,
    }
    return _carried(moves, resident)
