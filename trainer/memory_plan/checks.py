"""Conditions a plan must meet besides its peak (the vLLM engine's start), and the notes printed with it."""

from __future__ import annotations

from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.plan import RUNTIME_BYTES
from trainer.memory_plan.residency import role_memory
from trainer.memory_plan.setup import PlanSetup

# What vLLM needs besides its weights inside its budget to start: activations of its profiling run and a
# KV cache of a useful size (an allowance).
ENGINE_HEADROOM_BYTES = 1 << 30


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def startup_problems(setup: PlanSetup, gpu_bytes: int | None) -> list[str]:
    """vLLM refuses to start when the GPU's free memory is below its budget (gpu_memory_utilization x the
    GPU), and cannot serve when its budget does not hold its weights and a KV cache."""
    rollout = setup.rollout
    if rollout.name != "vllm" or not gpu_bytes or not setup.on_gpu:
        return []
    problems = []
    budget = int(rollout.gpu_memory_utilization * gpu_bytes)
    key = "actor_rollout_ref.rollout.gpu_memory_utilization"
    engine_gpus = 1 if rollout.placement == "hybrid" else rollout.tp
    weights = setup.actor.e * setup.actor.shape.total_params() // engine_gpus
    if budget < weights + ENGINE_HEADROOM_BYTES:
        problems.append(
            f"{key}={rollout.gpu_memory_utilization} gives the vLLM engine {gib(budget)} per GPU, less than its weights "
            f"({gib(weights)}) plus room for a KV cache; raise it"
        )
    if rollout.placement == "hybrid":
        # The engine starts after the actor (and a separate reference) loaded, before anything is offloaded.
        before = RUNTIME_BYTES
        for role in (setup.actor, setup.ref):
            if role is not None:
                mem = role_memory(role, setup.gpus_per_pool)
                before += mem.weights + (mem.grads if role.strategy == "megatron" else 0)
        free = gpu_bytes - before
        if free < budget:
            most = max(0.0, free / gpu_bytes)
            problems.append(
                f"{key}={rollout.gpu_memory_utilization} asks {gib(budget)} when the hybrid vLLM engine starts, but only "
                f"{gib(free)} are free then (the actor's and reference's weights are on the GPU); vLLM refuses to "
                f"start: lower it to at most {most:.2f}"
            )
    return problems


def plan_notes(setup: PlanSetup, gpu_bytes: int | None) -> list[str]:
    notes = [
        f"sequences at their maximum: {setup.prompt} prompt + {setup.response} response tokens, every response full "
        f"length; micro-batches of {setup.update.tokens} tokens per GPU (update), "
        + (f"{setup.old_log_prob.tokens} (old log-probs), " if setup.old_log_prob else "no old log-prob pass (the update gives them), ")
        + ("packed" if setup.packed else "padded"),
        f"'other' holds {gib(RUNTIME_BYTES)} per GPU process for the CUDA context, cuBLAS/NCCL workspaces and "
        "allocator slack (an allowance), and weight-sync buffers",
    ]
    updates = (("actor", setup.update), ("critic", setup.critic_update))
    sharing = {role: batch.sequence_parallel for role, batch in updates if batch and batch.sequence_parallel > 1}
    if sharing:
        listed = ", ".join(f"{role} {size}" for role, size in sharing.items())
        notes.append(
            f"Ulysses sequence parallelism ({listed} GPUs per sequence): each GPU of a group holds the activations and "
            "logits of its share of a micro-batch's tokens (the token counts above are per GPU); weights, gradients "
            "and optimizer state stay sharded over every GPU"
        )
    actor = setup.actor
    mem = role_memory(actor, setup.gpus_per_pool)
    shares_base = setup.rollout.shares_base and setup.on_gpu
    if actor.train is not None and actor.train.lora_rank:
        engine_note = "a sleeping vLLM engine keeps its base weights in host memory"
        if shares_base:
            whole = actor.e * actor.shape.total_params()
            engine_note = (
                f"the base is shared with the hybrid vLLM engine (rollout.share_base_weights): one copy ({gib(whole)}), "
                "the engine's, under weights while it sleeps (its sleep frees only the KV cache) and inside its share "
                "while awake; the actor's own copy lives only until the engine has started, and only the adapters "
                "move with param_offload"
            )
        notes.append(
            f"LoRA rank {actor.train.lora_rank} on {list(actor.train.lora_targets)}: base weights frozen in the compute "
            f"dtype, float32 adapters with their gradients and AdamW state; the reference is the base model (adapters "
            f"off); {engine_note}"
        )
    if setup.rollout.name == "vllm" and not gpu_bytes:
        notes.append("the GPU's memory is unknown: the vLLM engine's share (gpu_memory_utilization x the GPU) is left "
                     "out; set trainer.gpu_memory_gib")
    if setup.on_gpu and setup.rollout.name == "vllm" and setup.rollout.placement == "hybrid" and not setup.rollout.sleeps:
        notes.append("the hybrid engine does not sleep (rollout.enable_sleep / free_cache_engine false): it keeps its "
                     "share of the GPU in every phase")
    host = 0
    host += mem.weights - (mem.frozen_base if shares_base else 0) if actor.param_offload else 0
    host += mem.optimizer if actor.optimizer_offload else 0
    if setup.ref is not None and setup.ref.param_offload:
        host += role_memory(setup.ref, setup.gpus_per_pool).weights
    if host:
        notes.append(f"page-locked host memory for the offloaded state (allocated once, at the first offload): "
                     f"{gib(host)} per GPU")
    roles = [r for r in (setup.actor, setup.ref, setup.critic, setup.reward_model) if r is not None]
    if any(r.strategy == "megatron" for r in roles):
        notes.append("Megatron terms (tensor/pipeline slices, vocabulary-parallel logits) are approximations; the FSDP "
                     "terms are the ones checked against measured allocations")
    inexact = sorted({r.shape.model_type for r in roles if not r.shape.exact})
    if inexact:
        notes.append(f"model type(s) {inexact}: counted as Llama-style decoders (parameter counts may differ)")
    return notes
