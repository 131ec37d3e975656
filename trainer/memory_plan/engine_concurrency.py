"""How many full-length sequences a vLLM engine's KV cache holds at once, beside how many one step gives each
engine. An engine given more than its cache holds generates them in waves, each about as long as a whole
response, so its generation takes that many times longer whatever the GPU's compute: the plan says so before a
run starts (the run logs vLLM's own figure as `rollout/kv_cache_sequences`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainer.memory_plan.engine_profile import engine_overhead_bytes, engine_step_limits
from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.plan import engine_weight_bytes
from trainer.memory_plan.setup import PlanSetup
from trainer.memory_plan.terms import kv_cache_bytes

# vLLM hands its KV cache out in blocks of this many tokens (its default block size), so a sequence takes whole ones.
KV_BLOCK_TOKENS = 16
UTILIZATION_STEP = 0.05  # the suggested gpu_memory_utilization is rounded up to a multiple of this


@dataclass(frozen=True)
class EngineConcurrency:
    kv_bytes: int  # the engine's KV cache on one of its GPUs
    sequence_bytes: int  # one sequence of max_model_len tokens in it, on one GPU
    length: int  # max_model_len
    at_once: int  # sequences of max_model_len tokens the cache holds
    per_step: int  # rollout sequences one step gives each engine
    max_num_seqs: int | None = None  # rollout.max_num_seqs: the engine runs at most this many at once

    @property
    def running(self) -> int:
        """Sequences the engine runs at once: what its cache holds, or fewer where max_num_seqs says so."""
        return min(self.at_once, self.max_num_seqs) if self.max_num_seqs else self.at_once

    @property
    def waves(self) -> int:
        return math.ceil(self.per_step / max(1, self.running))


def engine_concurrency(setup: PlanSetup, gpu_bytes: int | None) -> EngineConcurrency | None:
    """The estimate for a vLLM engine on GPUs (None for HF generate, on the CPU, or while the GPU's memory is
    unknown): its cache is rollout.kv_cache_gib, or what gpu_memory_utilization leaves of the GPU after the
    engine's weights, its start-up profile run's peak and its CUDA graphs (engine_profile.py)."""
    rollout = setup.rollout
    if rollout.name != "vllm" or not setup.on_gpu:
        return None
    if rollout.kv_cache_bytes is not None:
        kv = rollout.kv_cache_bytes
    elif gpu_bytes:
        budget = int(rollout.gpu_memory_utilization * gpu_bytes)
        kv = budget - engine_weight_bytes(setup) - engine_overhead_bytes(setup, gpu_bytes)
    else:
        return None
    kv = max(0, kv)
    blocks = math.ceil(rollout.max_model_len / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    sequence = kv_cache_bytes(setup.actor.shape, rollout.engine_e, 1, blocks) // rollout.tp
    hybrid = rollout.placement == "hybrid"
    engines = max(1, setup.gpus_per_pool // rollout.tp) if hybrid else max(1, rollout.num_engines)
    per_step = math.ceil(setup.rows_per_gpu * setup.gpus_per_pool / engines)
    return EngineConcurrency(kv, sequence, rollout.max_model_len, kv // sequence, per_step, rollout.max_num_seqs)


def concurrency_note(setup: PlanSetup, gpu_bytes: int | None) -> str | None:
    """The plan's note on the engine's concurrency, with what to change when a step's sequences do not fit at once."""
    found = engine_concurrency(setup, gpu_bytes)
    return _describe(found, setup, gpu_bytes) if found is not None else None


def concurrency_warnings(setup: PlanSetup, gpu_bytes: int | None) -> list[str]:
    """The note as a run's warning where a step's sequences do not fit the engines' caches at once."""
    found = engine_concurrency(setup, gpu_bytes)
    return [_describe(found, setup, gpu_bytes)] if found is not None and found.waves > 1 else []


def _describe(found: EngineConcurrency, setup: PlanSetup, gpu_bytes: int | None) -> str:
    held = (
        f"the vLLM engine's KV cache: about {found.kv_bytes / GIB:.1f} GiB per GPU, {found.at_once} sequences of "
        f"{found.length} tokens at once; a step gives each engine {found.per_step}"
    )
    if found.waves <= 1:
        return f"{held} (all at once)"
    if found.running < found.at_once:  # the cache holds them: max_num_seqs is what splits them into waves
        return (
            f"{held}, but actor_rollout_ref.rollout.max_num_seqs={found.max_num_seqs} runs at most that many at once: "
            f"it generates them in about {found.waves} waves of full-length responses; raise it to {found.per_step} "
            "or leave it null (vLLM's default)"
        )
    needed = found.per_step * found.sequence_bytes
    tensor_parallel = "more GPUs per engine (actor_rollout_ref.rollout.tensor_model_parallel_size: its weights split)"
    if setup.rollout.kv_cache_bytes is not None:
        change = f"actor_rollout_ref.rollout.kv_cache_gib={math.ceil(needed / GIB * 10) / 10:g} or {tensor_parallel}"
    else:
        share = (needed + engine_weight_bytes(setup) + engine_overhead_bytes(setup, gpu_bytes)) / gpu_bytes
        utilization = math.ceil(share / UTILIZATION_STEP) * UTILIZATION_STEP
        change = (f"actor_rollout_ref.rollout.gpu_memory_utilization={utilization:.2f} or {tensor_parallel}"
                  if utilization <= 1 else tensor_parallel)
        change += _fewer_requests_note(setup, gpu_bytes, found.per_step)
    waves = (
        "vLLM refuses to start with a cache that holds none" if found.at_once == 0 else
        f"it generates them in about {found.waves} waves of full-length responses, so generation takes about "
        f"{found.waves}x the time of one"
    )
    return f"{held}: {waves}; all at once needs about {needed / GIB:.1f} GiB of KV cache per GPU: {change}"


def _fewer_requests_note(setup: PlanSetup, gpu_bytes: int | None, per_step: int) -> str:
    """Where rollout.max_num_seqs is vLLM's default and above what a step gives the engine: setting it to that
    count shrinks the sampler's peak in vLLM's start-up profile, which its KV cache then gets."""
    seqs, _ = engine_step_limits(setup, gpu_bytes)
    if setup.rollout.max_num_seqs is not None or seqs <= per_step:
        return ""
    fewer = replace(setup, rollout=replace(setup.rollout, max_num_seqs=per_step))
    freed = engine_overhead_bytes(setup, gpu_bytes) - engine_overhead_bytes(fewer, gpu_bytes)
    if freed < GIB // 10:
        return ""
    return (f"; also actor_rollout_ref.rollout.max_num_seqs={per_step} (vLLM's default {seqs}) gives its KV cache "
            f"{freed / GIB:.1f} GiB more: vLLM's start-up profile then samples for that many requests")
