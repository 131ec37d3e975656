"""Conditions a plan must meet besides its peak (the vLLM engine's start), and the notes printed with it."""

from __future__ import annotations

import math

from trainer.memory_plan.engine_concurrency import concurrency_note
from trainer.memory_plan.engine_profile import engine_overhead_bytes
from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.plan import (
    ENGINE_SHARD_BYTES,
    ENGINE_WORKER_PROCESS_BYTES,
    RUNTIME_BYTES,
    engine_weight_bytes,
)
from trainer.memory_plan.residency import role_memory
from trainer.memory_plan.setup import PlanSetup
from trainer.memory_plan.terms import kv_cache_bytes

UTILIZATION_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"
KV_CACHE_KEY = "actor_rollout_ref.rollout.kv_cache_gib"


def gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def startup_problems(setup: PlanSetup, gpu_bytes: int | None) -> list[str]:
    """vLLM refuses to start when the GPU's free memory is below its budget (gpu_memory_utilization x the
    GPU; it checks this with a fixed KV cache too), and cannot serve when its budget does not hold its weights
    and a KV cache, or a fixed KV cache (rollout.kv_cache_gib) does not hold one sequence of max_model_len."""
    rollout = setup.rollout
    if rollout.name != "vllm" or not setup.on_gpu:
        return []
    problems = []
    fixed_kv = rollout.kv_cache_bytes is not None
    one_sequence = kv_cache_bytes(setup.actor.shape, rollout.engine_e, 1, rollout.max_model_len) // rollout.tp
    if fixed_kv:
        # vLLM's own check (kv_cache_utils._check_enough_kv_cache_memory), whose message would ask for a
        # higher gpu_memory_utilization, which a fixed cache ignores. About: vLLM counts whole blocks.
        if rollout.kv_cache_bytes < one_sequence:
            least = math.ceil(one_sequence / GIB * 100) / 100
            problems.append(
                f"{KV_CACHE_KEY}={rollout.kv_cache_bytes / GIB:g} holds less than one sequence of max_model_len="
                f"{rollout.max_model_len} tokens (about {least:.2f} GiB per GPU); vLLM refuses to start: raise it to "
                f"at least {least:.2f} or lower actor_rollout_ref.rollout.max_model_len"
            )
    if not gpu_bytes:
        return problems
    budget = int(rollout.gpu_memory_utilization * gpu_bytes)  # vLLM's budget
    weights = engine_weight_bytes(setup)
    overhead = engine_overhead_bytes(setup, gpu_bytes)
    # With a fixed KV cache vLLM does not fit the engine into its budget: the budget only gates the start (below).
    # Else its KV cache gets what the budget leaves after the weights and its start-up profile; it must hold one
    # sequence of max_model_len or vLLM refuses to start.
    if not fixed_kv and budget < weights + overhead + one_sequence:
        least = math.ceil((weights + overhead + one_sequence) / gpu_bytes * 100) / 100
        problems.append(
            f"{UTILIZATION_KEY}={rollout.gpu_memory_utilization} gives the vLLM engine {gib(budget)} per GPU, "
            f"less than its weights ({gib(weights)}) plus its start-up profile's peak and CUDA graphs "
            f"({gib(overhead)}) plus one sequence of max_model_len={rollout.max_model_len} in its KV cache; vLLM "
            f"refuses to start: raise it to at least {least:.2f}"
        )
    if rollout.placement == "hybrid":
        # The engine starts after the actor (and a separate reference) loaded and offloaded what they offload; the
        # actor's weights are back for the sync check (rollout.verify_sync), and a base to be shared stays.
        before = RUNTIME_BYTES
        for role in (setup.actor, setup.ref):
            if role is not None:
                mem = role_memory(role, setup.gpus_per_pool)
                stays = role.name == "actor" and (rollout.verify_sync or rollout.shares_base)
                before += mem.weights if stays or not role.param_offload else 0
                before += mem.grads if role.strategy == "megatron" and not role.grad_offload else 0
        free = gpu_bytes - before
        if free < budget:
            most = max(0.0, free / gpu_bytes)
            only_gate = (
                f" (with {KV_CACHE_KEY} set it only sets this check: the engine takes its weights + the KV cache + "
                f"{gib(overhead)})" if fixed_kv else ""
            )
            problems.append(
                f"{UTILIZATION_KEY}={rollout.gpu_memory_utilization} asks {gib(budget)} when the hybrid vLLM engine "
                f"starts, but only {gib(free)} are free then (the actor's and reference's weights are on the GPU); "
                f"vLLM refuses to start: lower it to at most {most:.2f}{only_gate}"
            )
    return problems


def plan_notes(setup: PlanSetup, gpu_bytes: int | None) -> list[str]:
    notes = [
        f"sequences at their maximum: {setup.prompt} prompt + {setup.response} response tokens, every response full "
        f"length; micro-batches of {setup.update.tokens} tokens per GPU (update), "
        + (
            f"{setup.old_log_prob.tokens} (old log-probs), "
            if setup.old_log_prob
            else "no old log-prob pass (the update gives them), "
        )
        + ("packed" if setup.packed else "padded"),
        f"'other' holds {gib(RUNTIME_BYTES)} per GPU process for the CUDA context, cuBLAS/NCCL workspaces and "
        "allocator slack (an allowance), and weight-sync buffers",
    ]
    rollout = setup.rollout
    if setup.on_gpu and rollout.name == "vllm" and rollout.placement == "hybrid" and rollout.tp > 1:
        where = (f"{gib(ENGINE_WORKER_PROCESS_BYTES)} per GPU for the engine's worker process there"
                 if rollout.own_processes else
                 f"{gib(ENGINE_SHARD_BYTES)} per GPU for its shard's communicators and kernels in the trainer process")
        notes.append(f"a hybrid engine of tensor parallel {rollout.tp}: from its start 'other' holds {where} "
                     "(an allowance, measured at 7B on H200s)")
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
                "the base is shared with the hybrid vLLM engine (rollout.share_base_weights): "
                f"one copy ({gib(whole)}), the engine's, under weights while it sleeps (its sleep frees only the KV "
                "cache) and inside its share while awake; the actor's own copy lives only until the engine has "
                "started, and only the adapters move with param_offload"
            )
        notes.append(
            f"LoRA rank {actor.train.lora_rank} on {list(actor.train.lora_targets)}: base weights frozen in the "
            "compute dtype, float32 adapters with their gradients and AdamW state; the reference is the base model "
            f"(adapters off); {engine_note}"
        )
    if rollout.name == "vllm" and rollout.kv_cache_bytes is not None:
        notes.append(
            f"the vLLM engine's share per GPU while awake: its weights ({gib(engine_weight_bytes(setup))}) + "
            f"{KV_CACHE_KEY} ({gib(rollout.kv_cache_bytes)}) + {gib(engine_overhead_bytes(setup, gpu_bytes))} for its "
            "start-up profile run's peak and CUDA graphs (counted, not measured: with a fixed KV cache vLLM does not "
            f"measure them); {UTILIZATION_KEY} only sets the free memory its start requires"
        )
    elif rollout.name == "vllm" and not gpu_bytes:
        notes.append("the GPU's memory is unknown: the vLLM engine's share (gpu_memory_utilization x the GPU) is left "
                     "out; set trainer.gpu_memory_gib")
    concurrency = concurrency_note(setup, gpu_bytes)
    if concurrency:
        notes.append(concurrency)
    if setup.on_gpu and rollout.name == "vllm" and rollout.placement == "hybrid" and not rollout.sleeps:
        notes.append("the hybrid engine does not sleep (rollout.enable_sleep / free_cache_engine false): it keeps its "
                     "share of the GPU in every phase")
    host = mem.weights - (mem.frozen_base if shares_base else 0) if actor.param_offload else 0
    host += mem.optimizer if actor.optimizer_offload else 0
    host += mem.grads if actor.grad_offload else 0
    if setup.ref is not None and setup.ref.param_offload:
        host += role_memory(setup.ref, setup.gpus_per_pool).weights
    critic = setup.critic
    if critic is not None and (critic.param_offload or critic.optimizer_offload or critic.grad_offload):
        critic_mem = role_memory(critic, setup.gpus_per_pool)
        critic_host = critic_mem.weights if critic.param_offload else 0
        critic_host += critic_mem.optimizer if critic.optimizer_offload else 0
        critic_host += critic_mem.grads if critic.grad_offload else 0
        # per GPU: a colocated critic's beside the actor's, a separate one's on GPUs of its own
        host = host + critic_host if setup.placement == "colocated" else max(host, critic_host)
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
