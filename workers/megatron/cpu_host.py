"""Running megatron-core's model code on a machine without a GPU (tests and CI; not for speed).

megatron-core asks CUDA for its device in many places (`torch.cuda.current_device()`, `device="cuda"`
in factory calls, the CUDA RNG tracker). Its collectives, layers and schedules are plain torch and run
over gloo once those lookups answer "cpu". `enable()` makes them do so in this process; it is a no-op
when CUDA is available, so the same worker code runs unchanged on GPU machines.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_enabled = False


class _CudaToCpu(TorchFunctionMode):
    """Rewrites `device="cuda..."` arguments of torch calls (factories, `.to`, `.cuda()`) to the CPU and
    reports CPU tensors under their CUDA type names."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # Megatron asserts CUDA tensor type names (e.g. before clipping gradients).
            return func(*args).replace("torch.", "torch.cuda.", 1)
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        args = tuple("cpu" if isinstance(a, (str, torch.device)) and _is_cuda(a) else a for a in args)
        return func(*args, **kwargs)


def _is_cuda(value: str | torch.device) -> bool:
    try:
        return torch.device(value).type == "cuda"
    except (RuntimeError, TypeError):
        return False  # a string argument that is not a device (e.g. an einsum equation)


def enable() -> None:
    """On a host without CUDA: route megatron-core's CUDA device lookups to the CPU and use its no-op RNG
    tracker (RL training here runs without dropout, so no model-parallel RNG streams are needed)."""
    global _enabled
    if _enabled or torch.cuda.is_available():
        return
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # CPU work is already synchronous
    _CudaToCpu().__enter__()  # stays active for the life of this worker process
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    _enabled = True
