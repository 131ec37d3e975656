"""Running megatron-core's model code on a machine without a GPU (tests and CI; not for speed).

megatron-core asks CUDA for its device in many places (`torch.cuda.current_device()`, `device="cuda"`
in factory calls, the CUDA RNG tracker). Its collectives, layers and schedules are plain torch and run
over gloo once those lookups answer "cpu". `enable()` makes them do so in this process; it is a no-op
when CUDA is available, so the same worker code runs unchanged on GPU machines.
"""

from __future__ import annotations

from contextlib import nullcontext
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


class _CpuEvent:
    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass


class _CpuStream:
    """Stands in for a CUDA stream: CPU work is synchronous, so waiting and events do nothing (the MoE all-to-all
    dispatcher copies its token counts to the host on a side stream)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _CpuEvent:
        return _CpuEvent()

    def synchronize(self) -> None:
        pass


_CURRENT_STREAM = _CpuStream()


def _host_copy(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """megatron-core's `maybe_move_tensor_to_cpu` turns only CUDA tensors into host numpy arrays; its all-to-all
    then passes the split sizes to `all_to_all_single`, which takes lists, not tensors. Here every tensor is on the
    host already: make the same numpy arrays."""
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


def _route_moe_host_copies() -> None:
    from megatron.core.transformer.moe import token_dispatcher

    if hasattr(token_dispatcher, "maybe_move_tensor_to_cpu"):
        token_dispatcher.maybe_move_tensor_to_cpu = _host_copy


def enable() -> None:
    """On a host without CUDA: route megatron-core's CUDA device lookups to the CPU and use its no-op RNG
    tracker (RL training here runs without dropout, so no model-parallel RNG streams are needed)."""
    global _enabled
    if _enabled or torch.cuda.is_available():
        return
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # CPU work is already synchronous
    torch.cuda.Stream = _CpuStream  # type: ignore[assignment, misc]
    torch.cuda.current_stream = lambda device=None: _CURRENT_STREAM  # type: ignore[assignment]
    torch.cuda.stream = lambda stream: nullcontext()  # type: ignore[assignment]
    _CudaToCpu().__enter__()  # stays active for the life of this worker process
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    _route_moe_host_copies()
    _route_recompute_rng_states()
    _route_uneven_gathers()
    _enabled = True


def _route_recompute_rng_states() -> None:
    """A recomputed layer (model.enable_gradient_checkpointing) saves the CUDA generator's state with its input and
    restores it in the backward; the CPU generator's state (torch's own, also saved) stands in for it here."""
    from megatron.core.tensor_parallel import random

    random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    random._set_cuda_rng_state = lambda *args, **kwargs: None


def _route_uneven_gathers() -> None:
    """gloo's all-gather takes equal parts only. With tensor x expert parallel layers the MoE dispatcher gathers the
    tensor-parallel group's tokens in uneven parts (and reduce-scatters them back likewise): pad each part to the
    largest for the gather; all-reduce and keep this rank's slice for the reduce-scatter."""
    from megatron.core.tensor_parallel import mappings

    gather, reduce_scatter = mappings._gather_along_first_dim, mappings._reduce_scatter_along_first_dim

    def gather_uneven(input_: Any, group: Any, output_split_sizes: Any = None, use_global_buffer: bool = False) -> Any:
        if output_split_sizes is None or group.size() == 1:
            return gather(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(n) for n in output_split_sizes]
        padded = input_.new_zeros((max(sizes), *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])

    def reduce_scatter_uneven(
        input_: Any, group: Any, input_split_sizes: Any = None, use_global_buffer: bool = False
    ) -> Any:
        if input_split_sizes is None or group.size() == 1:
            return reduce_scatter(input_, group, input_split_sizes, use_global_buffer)
        sizes = [int(n) for n in input_split_sizes]
        total = input_.contiguous().clone()
        torch.distributed.all_reduce(total, group=group)
        start = sum(sizes[: torch.distributed.get_rank(group)])
        return total[start : start + sizes[torch.distributed.get_rank(group)]]

    mappings._gather_along_first_dim = gather_uneven
    mappings._reduce_scatter_along_first_dim = reduce_scatter_uneven
