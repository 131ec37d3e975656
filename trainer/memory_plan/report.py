"""The plan as a table (`trainer.plan_only=true`), as one summary line, and as one line saying why it does not fit."""

from __future__ import annotations

from trainer.memory_plan.checks import gib
from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.plan import COLUMNS, MemoryPlan, Row
from trainer.memory_plan.setup import PlanSetup

# What lowers each kind of memory, for the message of a plan that does not fit.
SHARD = "more GPUs to shard over (trainer.n_gpus_per_node)"
LORA = "LoRA (actor_rollout_ref.model.lora_rank)"
PARAM_OFFLOAD = "actor_rollout_ref.actor.fsdp_config.param_offload=true"
OPTIMIZER_OFFLOAD = "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true (between updates)"
MEGATRON_PARAM_OFFLOAD = "actor_rollout_ref.actor.megatron.param_offload=true"
MEGATRON_GRAD_OFFLOAD = "actor_rollout_ref.actor.megatron.grad_offload=true"
MEGATRON_OPTIMIZER_OFFLOAD = "actor_rollout_ref.actor.megatron.optimizer_offload=true"
CRITIC_PARAM_OFFLOAD = "critic.model.fsdp_config.param_offload=true"
CRITIC_OPTIMIZER_OFFLOAD = "critic.model.fsdp_config.optimizer_offload=true"
CHUNKED_LOGITS = (
    "a smaller actor_rollout_ref.model.logits_chunk_tokens (log-probs from the LM head in chunks of tokens; "
    "0 computes the full logits)"
)
SMALLER_MICRO = (
    "smaller micro-batches (actor.ppo_micro_batch_size_per_gpu, rollout/ref.log_prob_micro_batch_size_per_gpu, "
    "or the *_max_token_len_per_gpu budgets)"
)
ULYSSES = (
    "Ulysses sequence parallelism (actor_rollout_ref.actor.ulysses_sequence_parallel_size: GPUs sharing each sequence)"
)
# The engine's share: its budget, or with a fixed KV cache that cache (the budget then only gates its start).
LOWER_UTILIZATION = "a lower actor_rollout_ref.rollout.gpu_memory_utilization"
SMALLER_KV_CACHE = "a smaller actor_rollout_ref.rollout.kv_cache_gib"
# What lowers each column, most effective first; `misfit_message` lists each suggestion once and leaves out
# the settings a run already has and those that do not apply to it (`MemoryPlan.settings_on`).
REMEDIES = {
    "weights": (SHARD, PARAM_OFFLOAD, MEGATRON_PARAM_OFFLOAD, CRITIC_PARAM_OFFLOAD, LORA),
    "grads": (SHARD, MEGATRON_GRAD_OFFLOAD, LORA),
    "optimizer": (SHARD, LORA, OPTIMIZER_OFFLOAD, MEGATRON_OPTIMIZER_OFFLOAD, CRITIC_OPTIMIZER_OFFLOAD),
    "activations": ("actor_rollout_ref.model.enable_gradient_checkpointing=true", SMALLER_MICRO, ULYSSES),
    "logits": (CHUNKED_LOGITS, SMALLER_MICRO, ULYSSES),
    "engine": (LOWER_UTILIZATION, SMALLER_KV_CACHE),
    "other": ("a smaller actor_rollout_ref.rollout.weight_sync_bucket_mb",),
}


def _remedies(columns: list[str], already: set[str]) -> str:
    listed = list(dict.fromkeys(r for c in columns for r in REMEDIES[c] if r not in already))
    return ", ".join(listed[:-1]) + f" or {listed[-1]}" if len(listed) > 1 else "".join(listed)


def _cell(value: int) -> str:
    return f"{value / GIB:.1f}" if value else "-"


def render_plan(plan: MemoryPlan) -> str:
    gpu = gib(plan.gpu_bytes) if plan.gpu_bytes else "unknown"
    header = ["role", "phase", "peak moment", *COLUMNS, "total/GPU", "GPU"]
    lines = [f"memory plan per GPU, GiB (GPU memory: {gpu}, {plan.gpu_source})"]
    for group in plan.groups:
        table = [header] + [
            [row.role, row.phase, row.moment, *(_cell(row.parts[c]) for c in COLUMNS), f"{row.total / GIB:.1f}",
             f"{plan.gpu_bytes / GIB:.1f}" if plan.gpu_bytes else "?"]
            for row in group.rows
        ]
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        lines.append(f"\n{group.name} ({group.gpus}):")
        for i, cells in enumerate(table):
            lines.append(
                "  " + "  ".join(c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths)))
            )
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(verdict(plan))
    lines.extend(f"problem: {p}" for p in plan.problems)
    lines.extend(f"note: {n}" for n in plan.notes)
    return "\n".join(lines)


def _where(plan: MemoryPlan) -> tuple[str, Row]:
    group, row = plan.peak()
    return f"{group.name}, {row.phase} ({row.moment})", row


def verdict(plan: MemoryPlan) -> str:
    where, row = _where(plan)
    if plan.gpu_bytes is None:
        return (
            f"peak {gib(row.total)} per GPU ({where}); the GPU's memory is unknown: "
            "set trainer.gpu_memory_gib to check the fit"
        )
    spare = plan.gpu_bytes - row.total
    if plan.fits():
        return f"fits: peak {gib(row.total)} of {gib(plan.gpu_bytes)} per GPU ({where}), {gib(spare)} to spare"
    if spare < 0:
        return f"does not fit: peak {gib(row.total)} of {gib(plan.gpu_bytes)} per GPU ({where}), short by {gib(-spare)}"
    return (
        f"does not fit: peak {gib(row.total)} of {gib(plan.gpu_bytes)} per GPU ({where}), but vLLM cannot start (below)"
    )


def summary_line(plan: MemoryPlan) -> str:
    return f"memory plan: {verdict(plan)}; trainer.plan_only=true prints the table"


def misfit_message(plan: MemoryPlan) -> str:
    """One line: what does not fit, what to change, how to see the table or run anyway."""
    if plan.problems:
        reason = plan.problems[0]
    else:
        where, row = _where(plan)
        largest = sorted((c for c in COLUMNS if row.parts[c]), key=lambda c: row.parts[c], reverse=True)[:2]
        terms = ", ".join(f"{c} {gib(row.parts[c])}" for c in largest)
        remedy = _remedies(largest, plan.settings_on)
        reason = (
            f"{where} needs {gib(row.total)} per GPU but the GPU has {gib(plan.gpu_bytes or 0)} (largest: {terms}); "
            f"try {remedy}"
        )
    return f"memory plan: {reason}; trainer.plan_only=true prints the plan, trainer.memory_check=warn runs anyway"


def settings_on(setup: PlanSetup) -> set[str]:
    """The remedies not to suggest: settings the run already has, and the engine setting that does not size its
    share (with a fixed KV cache the utilization only gates the start; without one there is no cache size)."""
    actor = setup.actor
    # The actor's switches of its own strategy; the other strategy's (and LoRA with Megatron) are never suggested.
    if actor.strategy == "megatron":
        switches = {MEGATRON_PARAM_OFFLOAD: actor.param_offload, MEGATRON_GRAD_OFFLOAD: actor.grad_offload,
                    MEGATRON_OPTIMIZER_OFFLOAD: actor.optimizer_offload}
        on = {PARAM_OFFLOAD, OPTIMIZER_OFFLOAD, LORA}
    else:
        switches = {PARAM_OFFLOAD: actor.param_offload, OPTIMIZER_OFFLOAD: actor.optimizer_offload}
        on = {MEGATRON_PARAM_OFFLOAD, MEGATRON_GRAD_OFFLOAD, MEGATRON_OPTIMIZER_OFFLOAD}
    on |= {key for key, is_set in switches.items() if is_set}
    # The critic's switches: not suggested without a critic that could move its state (FSDP, on a GPU), or when on.
    critic = setup.critic
    movable = critic is not None and critic.strategy == "fsdp" and setup.on_gpu
    on |= {CRITIC_PARAM_OFFLOAD} if not movable or critic.param_offload else set()
    on |= {CRITIC_OPTIMIZER_OFFLOAD} if not movable or critic.optimizer_offload else set()
    on |= {LOWER_UTILIZATION} if setup.rollout.kv_cache_bytes is not None else {SMALLER_KV_CACHE}
    return on | ({LORA} if actor.train is not None and actor.train.lora_rank else set())
