"""The `LLM` arguments that follow from the rollout's settings and the device: CPU thread binding, eager mode or
CUDA graphs, KV cache sizing and sleep mode, the scheduler's keys. Pure functions: nothing starts, so they are
tested without vLLM."""

from __future__ import annotations

import os
from typing import Any

import torch


def cpu_thread_binding(tp: int) -> str:
    """vLLM's CPU backend binds each tensor-parallel worker's threads to cores of a NUMA node of its own and
    refuses when the process may use fewer nodes than workers (a one-node machine): split the cores this
    process may use into `tp` disjoint groups instead, in its `VLLM_CPU_OMP_THREADS_BIND` form (comma lists joined
    by "|": "0,1,2,3|4,5,6,7")."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tp:
        raise ValueError(
            f"rollout.tensor_model_parallel_size={tp} on CPU needs a core per engine worker; "
            f"this process may use {len(cores)}"
        )
    share = len(cores) // tp
    groups = [cores[i * share : (i + 1) * share] for i in range(tp)]
    return "|".join(",".join(str(c) for c in group) for group in groups)


def eager_mode(rollout: dict[str, Any], device: torch.device) -> bool:
    """`rollout.enforce_eager`, where None means CUDA graphs on a GPU and eager on CPU (vLLM's CPU build would
    spend 30-50 s in torch.compile at every engine start)."""
    setting = rollout.get("enforce_eager")
    return device.type != "cuda" if setting is None else bool(setting)


def device_options(rollout: dict[str, Any], device: torch.device, sleep: bool) -> dict[str, Any]:
    """The `LLM` arguments that depend on the device: how the KV cache is sized, sleep mode and the CUDA graphs'
    sizes on a GPU, whole-prompt scheduling on CPU. Pure (nothing starts), so it is tested without vLLM."""
    if device.type != "cuda":
        # vLLM's CPU backend sizes its KV cache from this (its GPU-memory fraction does not apply).
        # Seeded sampling of a prompt split across steps (chunked prefill) fails there ("CPU
        # Generator does not use offset"), so prompts are scheduled whole.
        return {"kv_cache_memory_bytes": int(rollout["cpu_kv_cache_mb"]) << 20, "enable_chunked_prefill": False}
    # vLLM still needs the fraction with a fixed KV cache: its start requires that much of the GPU free.
    options: dict[str, Any] = {
        "gpu_memory_utilization": float(rollout["gpu_memory_utilization"]),
        "enable_sleep_mode": sleep,
    }
    if rollout.get("kv_cache_gib") is not None:
        # A fixed KV cache skips vLLM's start-up measurement of its own memory (free memory before and after a
        # profiling forward), which fails when processes sharing the GPU allocate or free meanwhile.
        options["kv_cache_memory_bytes"] = int(float(rollout["kv_cache_gib"]) * (1 << 30))
    if not eager_mode(rollout, device) and rollout.get("cuda_graph_max_batch"):
        # Graphs for decode batches up to what this engine runs at once, not vLLM's default 512: each
        # captured size keeps memory outside the sleep-mode pool while the engine sleeps.
        options["compilation_config"] = {"max_cudagraph_capture_size": int(rollout["cuda_graph_max_batch"])}
    return options


def scheduler_options(rollout: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The `LLM` arguments of verl's scheduler keys: rollout.enable_chunked_prefill (on a GPU; CPU prompts are
    scheduled whole, see `device_options`), max_num_batched_tokens and max_num_seqs (None: vLLM's default).
    Pure (nothing starts), so it is tested without vLLM."""
    options: dict[str, Any] = {}
    chunked = rollout.get("enable_chunked_prefill")
    if device.type == "cuda" and chunked is not None:
        options["enable_chunked_prefill"] = bool(chunked)
    for key in ("max_num_batched_tokens", "max_num_seqs"):
        if rollout.get(key) is not None:
            options[key] = int(rollout[key])
    tokens, longest = options.get("max_num_batched_tokens"), rollout.get("max_model_len")
    whole_prompts = device.type != "cuda" or chunked is False
    if tokens is not None and longest is not None and whole_prompts and tokens < int(longest):
        raise ValueError(
            f"rollout.max_num_batched_tokens={tokens} is below max_model_len={longest} (prompt + response) while "
            "prompts are prefilled whole (enable_chunked_prefill off, always on CPU): raise it to at least "
            f"{longest}, or leave it null"
        )
    return options


def sleeps_between_calls(rollout: dict[str, Any], device: torch.device) -> bool:
    """Whether an engine of these settings releases its weights after each call (GPU sleep mode with
    free_cache_engine): known on every rank of a hybrid group, engine or not."""
    return bool(rollout["enable_sleep"]) and device.type == "cuda" and bool(rollout["free_cache_engine"])


def routing_options(rollout: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """`rollout.enable_rollout_routing_replay`: vLLM returns the experts each token was routed to. Its capture runs
    in the GPU model runner only (the CPU build's asks for Model Runner V2, which needs Triton)."""
    if not rollout.get("enable_rollout_routing_replay"):
        return {}
    if device.type != "cuda":
        raise ValueError(
            "rollout.enable_rollout_routing_replay=true with rollout.name='vllm' needs a GPU: vLLM's CPU backend does "
            "not return the experts it routed to; on CPU use rollout.name='hf' (HF generate records them)"
        )
    return {"enable_return_routed_experts": True}
