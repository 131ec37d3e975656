"""`rollout.engine_kwargs.vllm` (verl's key): extra arguments of vLLM's `LLM(...)`, passed as they are. Names are
checked against vLLM's own argument list, and those the engine sets itself from other keys are refused with the
key that sets them, so a typo or a conflict fails with its name instead of inside the engine's start."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any

# LLM(...) arguments the engine derives from other settings (workers/rollout/vllm_engine.py): the key to use.
SET_BY_OTHER_KEYS = {
    "model": "actor_rollout_ref.model.path",
    "dtype": "rollout.dtype",
    "seed": "actor_rollout_ref.seed / trainer.seed",
    "tensor_parallel_size": "rollout.tensor_model_parallel_size",
    "max_model_len": "rollout.max_model_len",
    "enforce_eager": "rollout.enforce_eager",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "enable_sleep_mode": "rollout.enable_sleep",
    "enable_chunked_prefill": "rollout.enable_chunked_prefill",
    "max_num_batched_tokens": "rollout.max_num_batched_tokens",
    "max_num_seqs": "rollout.max_num_seqs",
    "enable_lora": "actor_rollout_ref.model.lora_rank",
    "hf_overrides": "actor_rollout_ref.model.override_config",
    "max_lora_rank": "actor_rollout_ref.model.lora_rank",
    "enable_mixed_moe_lora_format": "actor_rollout_ref.model.target_modules (set when the experts are adapted)",
    "distributed_executor_backend": "rollout.engine_process",
    "worker_extension_cls": "(the weight-sync extension: not settable)",
    "logprobs_mode": "(processed log-probs, what the trainer measures: not settable)",
}


# Arguments of older vLLMs that verl's scripts still pass, and what they are in a vLLM without them: the new
# argument and its value for the old one's (None: nothing to set).
RENAMED_ARGUMENTS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "disable_mm_preprocessor_cache": ("mm_processor_cache_gb", lambda disabled: 0 if disabled else None),
}


def vllm_argument_names() -> frozenset[str]:
    from vllm.engine.arg_utils import EngineArgs

    return frozenset(field.name for field in dataclasses.fields(EngineArgs))


def vllm_engine_kwargs(engine_kwargs: Mapping[str, Any] | None, valid: frozenset[str] | None = None) -> dict[str, Any]:
    """The checked `rollout.engine_kwargs.vllm` arguments; ValueError names every bad one. `valid`: vLLM's
    argument names (read from vLLM when None)."""
    kwargs = dict((engine_kwargs or {}).get("vllm") or {})
    if not kwargs:
        return {}
    valid = vllm_argument_names() if valid is None else valid
    problems = []
    for name in list(kwargs):
        if name in RENAMED_ARGUMENTS and name not in valid:
            new_name, convert = RENAMED_ARGUMENTS[name]
            value = convert(kwargs.pop(name))
            if value is not None and new_name in valid:
                kwargs[new_name] = value
        elif name in SET_BY_OTHER_KEYS:
            problems.append(f"rollout.engine_kwargs.vllm.{name}: set by {SET_BY_OTHER_KEYS[name]}")
        elif name not in valid:
            near = difflib.get_close_matches(name, sorted(valid), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else ""
            problems.append(f"rollout.engine_kwargs.vllm.{name}: not an argument of this vLLM's engine{hint}")
    if problems:
        raise ValueError("; ".join(problems))
    return kwargs
