"""Varlen causal attention for packed rows, plugged into transformers' attention interface.

A packed row holds several sequences back to back; `cu_seq_lens_q` (int32 offsets, [n + 1]) marks where
each starts, and attention never crosses a boundary. Kernels, best first:
- the `flash_attn` package's varlen kernel (CUDA, half precision), when it is installed;
- PyTorch's own flash varlen kernel (`aten._flash_attention_forward`, CUDA, half precision);
- one causal SDPA call per sequence (any device and dtype: the CPU path, and fp32 on GPU).
A CUDA kernel is checked once per device/dtype against the per-sequence path before it is used.

`PACKED_ATTENTION` is registered under a name per base implementation (sdpa, eager, ...): calls without
packing offsets (generation, padded batches) go to the base implementation unchanged. A call that also
carries a sequence-parallel group (Ulysses, `workers/packing/ulysses.py`) holds one rank's shard of the row:
its queries, keys and values are exchanged for every token of a k-th of the heads around the kernel.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from workers.packing.ulysses import SEQUENCE_PARALLEL_KWARG, heads_to_sequence, sequence_to_heads

PACKED_PREFIX = "packed_"
_HALF = (torch.float16, torch.bfloat16)
_CHECKED_KERNELS: dict[tuple[str, torch.dtype], str] = {}


def _repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[T, h, D] -> [T, heads, D] for grouped-query attention (each key/value head serves heads/h queries)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def per_sequence_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int], scale: float
) -> torch.Tensor:
    """q [T, H, D], k/v [T, h, D] -> [T, H, D]: one causal SDPA per sequence (keys and values repeated to the
    query heads first)."""
    k, v = _repeat_heads(k, q.shape[1]), _repeat_heads(v, q.shape[1])
    pieces = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        seg = [x[start:end].transpose(0, 1) for x in (q, k, v)]  # [H, L, D]
        pieces.append(F.scaled_dot_product_attention(*seg, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(pieces) if pieces else torch.zeros_like(q)


def _flash_attn_package(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float, dropout: float
) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(
        q, k, v, cu, cu, max_len, max_len, dropout_p=dropout, softmax_scale=scale, causal=True
    )


def _torch_flash_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int, scale: float, dropout: float
) -> torch.Tensor:
    return torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, max_len, max_len, dropout, True, False, scale=scale
    )[0]


def _cuda_kernels() -> list[tuple[str, Callable[..., torch.Tensor]]]:
    kernels = []
    try:
        import flash_attn  # noqa: F401

        kernels.append(("flash_attn", _flash_attn_package))
    except ImportError:
        pass
    kernels.append(("torch_flash_varlen", _torch_flash_varlen))
    return kernels


def _kernel_works(kernel: Callable[..., torch.Tensor], device: torch.device, dtype: torch.dtype) -> bool:
    """Run the kernel on a small packed batch (3 sequences, 2 query heads per key head, keys and values at their
    own head count: the varlen kernels serve grouped-query attention without copies) against the per-sequence
    path, forward and backward."""
    generator = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(11, heads, 64, device=device, dtype=dtype, generator=generator, requires_grad=True)
        for heads in (4, 2, 2)
    )
    bounds = [0, 3, 4, 11]
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    try:
        with torch.enable_grad():  # the first packed call may come from a no-grad log-prob pass
            out = kernel(q, k, v, cu, 7, 0.125, 0.0)
            out.float().sum().backward()
    except (RuntimeError, TypeError, NotImplementedError) as error:
        warnings.warn(f"packed attention: kernel unavailable on {device}/{dtype} ({error}); using per-sequence SDPA")
        return False
    expected = per_sequence_attention(q.detach(), k.detach(), v.detach(), bounds, 0.125)
    return bool(
        torch.allclose(out.detach().float(), expected.float(), atol=2e-2, rtol=0)
        and all(torch.isfinite(x.grad).all() for x in (q, k, v))
    )


def kernel_name(device: torch.device, dtype: torch.dtype) -> str:
    """The varlen kernel packed attention uses on this device/dtype ("per_sequence_sdpa" where none is)."""
    if device.type != "cuda" or dtype not in _HALF:
        return "per_sequence_sdpa"
    key = (str(device), dtype)
    if key not in _CHECKED_KERNELS:
        _CHECKED_KERNELS[key] = next(
            (name for name, kernel in _cuda_kernels() if _kernel_works(kernel, device, dtype)), "per_sequence_sdpa"
        )
    return _CHECKED_KERNELS[key]


def varlen_causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
    dropout: float,
) -> torch.Tensor:
    """query [1, H, T, D], key/value [1, h, T, D] of one packed row -> [1, T, H, D]. The varlen kernels take the
    keys and values at their own head count; the per-sequence path repeats them to the query heads."""
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))
    name = kernel_name(q.device, q.dtype)
    if name == "per_sequence_sdpa":
        if dropout:
            raise ValueError(
                "packed attention on the per-sequence path has no attention dropout; set attention_dropout=0"
            )
        out = per_sequence_attention(q, k, v, cu_seq_lens.tolist(), scale)
    else:
        out = dict(_cuda_kernels())[name](q, k, v, cu_seq_lens, max_len, scale, dropout)
    return out.unsqueeze(0)


def _packed_attention(base: str) -> Callable[..., tuple[torch.Tensor, None]]:
    def attention(module: torch.nn.Module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs: Any):
        cu_seq_lens = kwargs.get("cu_seq_lens_q")
        if cu_seq_lens is None:
            if attention_mask is None:  # a plain causal call (the mask builder below returned None)
                return sdpa_attention_forward(
                    module, query, key, value, None, scaling=scaling, dropout=dropout, **kwargs
                )
            return ALL_ATTENTION_FUNCTIONS[base](
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
            )
        if query.shape[0] != 1:
            raise ValueError(f"packed attention takes one packed row; got a batch of {query.shape[0]}")
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        sequence_parallel = kwargs.get(SEQUENCE_PARALLEL_KWARG)
        if sequence_parallel is not None:
            query, key, value = (heads_to_sequence(x, sequence_parallel) for x in (query, key, value))
        out = varlen_causal_attention(query, key, value, cu_seq_lens, int(kwargs["max_length_q"]), scale, dropout)
        if sequence_parallel is not None:
            out = sequence_to_heads(out, sequence_parallel)
        return out, None

    return attention


def _packed_mask(base: str) -> Callable[..., Any]:
    base_mask = ALL_MASK_ATTENTION_FUNCTIONS[base] if base in ALL_MASK_ATTENTION_FUNCTIONS.valid_keys() else sdpa_mask

    def mask(*args: Any, **kwargs: Any) -> Any:
        # Packed rows come without a 2-D mask: attention uses the offsets, so no [T, T] mask is built.
        if kwargs.get("attention_mask") is None:
            return None
        return base_mask(*args, **kwargs)

    return mask


def packed_implementation(base: str | None) -> str:
    """Register (once) and return the packed attention name wrapping the base implementation."""
    base = base or "sdpa"
    if base.startswith(PACKED_PREFIX):
        return base
    if base != "eager" and base not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        raise ValueError(
            f"packed attention cannot wrap attn_implementation={base!r}; "
            f"valid: eager, {ALL_ATTENTION_FUNCTIONS.valid_keys()}"
        )
    name = PACKED_PREFIX + base
    if name not in ALL_ATTENTION_FUNCTIONS.valid_keys():
        AttentionInterface.register(name, _packed_attention(base))
        AttentionMaskInterface.register(name, _packed_mask(base))
    return name
