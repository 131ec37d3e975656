"""Pointing an FSDP2 parameter's local shard at rows of another tensor of the same values (no copy kept), or at a
tensor that is that shard itself (a tensor-parallel engine shard's weight, `holds_this_shard`).

FSDP2 keeps each parameter's shard in two tensors over one storage (torch's `FSDPParam`,
torch/distributed/fsdp/_fully_shard/_fsdp_param.py): `_sharded_param_data`, the shard flattened and padded to the size
of rank 0's shard (what the all-gather reads), and the sharded DTensor's `_local_tensor`, the unpadded [rows, ...] view
of it (what the optimizer, the state dict and the offloader see). With Shard(0) rank r's shard is rows [r * padded_rows,
r * padded_rows + rows) of the whole tensor, contiguous in a contiguous [out, in] tensor. Both tensors are replaced by
tensors over that window of the other tensor's storage (FSDP2's own `reset_sharded_param` replaces them too); the
DTensor, the module's parameter, stays the same object. A padded shard (the last rank's, when the rows do not divide
evenly) reads its padding from the bytes after its rows: it is pointed there only when the other storage extends that
far. FSDP only reads a frozen parameter's shard (the all-gather copies it in; its padding is cut off after the gather),
so whatever bytes the padding covers are never written. These are private attributes of torch's FSDP2 (read in torch
2.13).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule


def fsdp_params(model: nn.Module) -> dict[str, Any]:
    """Trainer parameter name -> its `FSDPParam`, over every FSDP2 unit of `model`."""
    names = {id(module): name for name, module in model.named_modules()}
    found: dict[str, Any] = {}
    for unit in model.modules():
        if not isinstance(unit, FSDPModule):
            continue
        group = unit._get_fsdp_state()._fsdp_param_group
        for param in group.fsdp_params if group is not None else ():
            owner = names[id(param._module_info.module)]
            found[f"{owner}.{param._module_info.param_name}" if owner else param._module_info.param_name] = param
    return found


def local_shard(param: Any) -> torch.Tensor:
    """The unpadded local shard of an `FSDPParam` (the DTensor's local tensor)."""
    return param.sharded_param._local_tensor


@dataclass(frozen=True)
class ShardWindow:
    """Where one rank's padded shard lies in the storage of a whole tensor, in elements."""

    rows_start: int  # the shard's first row in the whole tensor
    rows: int  # the shard's rows (unpadded)
    offset: int  # element offset of the padded shard in the storage
    padded_numel: int

    def fits(self, storage_numel: int) -> bool:
        return self.offset + self.padded_numel <= storage_numel


def shard_window(whole: torch.Tensor, rank: int, padded_rows: int, rows: int) -> ShardWindow:
    """Rank `rank`'s Shard(0) window in `whole` (contiguous), whose shards are `padded_rows` rows apart."""
    row_numel = math.prod(whole.shape[1:])
    start = rank * padded_rows
    return ShardWindow(start, rows, whole.storage_offset() + start * row_numel, padded_rows * row_numel)


def holds_this_shard(param: Any, tensor: torch.Tensor) -> bool:
    """Whether `tensor` is this rank's shard of `param` itself rather than the whole parameter: a tensor-parallel
    engine shard's weight of the local shard's shape, where the shard has no padding (FSDP2 pads only uneven
    shards). Shard(0) or Shard(1) alike: the local shard is contiguous either way."""
    local = local_shard(param)
    shape = tuple(tensor.shape)
    return shape != tuple(param._orig_size) and shape == tuple(local.shape) == tuple(param.padded_sharded_param_size)


def why_not_shareable(param: Any, whole: torch.Tensor) -> str | None:
    """Why `param`'s shard cannot be pointed into `whole`, the engine's tensor holding the whole parameter or
    exactly this rank's shard of it (None: it can)."""
    local = local_shard(param)
    if whole.dtype != local.dtype:
        return f"dtype {whole.dtype} in the engine, {local.dtype} in the trainer"
    if whole.device != local.device:
        return f"on {whole.device} in the engine, {local.device} in the trainer"
    this_shard = holds_this_shard(param, whole)
    if not this_shard and tuple(whole.shape) != tuple(param._orig_size):
        sharded = f" (this rank's shard: {tuple(local.shape)})" if tuple(local.shape) != tuple(param._orig_size) else ""
        return f"shape {tuple(whole.shape)} in the engine, {tuple(param._orig_size)} in the trainer{sharded}"
    if not whole.is_contiguous():
        return "not contiguous in the engine"
    if this_shard:
        return None
    if param.fsdp_placement.dim != 0:
        return f"sharded on dim {param.fsdp_placement.dim} (rows only)"
    window = _window(param, whole)
    if not window.fits(whole.untyped_storage().nbytes() // whole.element_size()):
        return "its shard's padding would run past the end of the engine's tensor"
    return None


def _window(param: Any, whole: torch.Tensor) -> ShardWindow:
    if holds_this_shard(param, whole):
        return ShardWindow(0, int(whole.shape[0]) if whole.dim() else 1, whole.storage_offset(), whole.numel())
    padded_rows = int(param.padded_sharded_param_size[0]) if len(param.padded_sharded_param_size) else 1
    rows = int(local_shard(param).shape[0]) if local_shard(param).dim() else 1
    return shard_window(whole, int(param.mesh_info.shard_mesh_rank), padded_rows, rows)


def rows_of(param: Any, whole: torch.Tensor) -> torch.Tensor:
    """What of `whole` this rank's shard of `param` holds: its rows, or all of it when it is that shard."""
    if holds_this_shard(param, whole):
        return whole
    window = _window(param, whole)
    return whole.narrow(0, window.rows_start, window.rows) if whole.dim() else whole


def _over(storage: torch.UntypedStorage, like: torch.Tensor, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of `like`'s dtype over `storage` from element `offset`, contiguous, and not a view: a view
    would keep the tensor it was taken from (its `_base`) alive."""
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(
        storage, offset, shape, torch.empty(shape, device="meta").stride()
    )


@torch.no_grad()
def point_shard_at(param: Any, whole: torch.Tensor) -> None:
    """Point `param`'s padded shard and its local tensor at this rank's rows of `whole`; the shard's own
    storage is then released. Call after `why_not_shareable` returned None. Both tensors are replaced, not
    re-pointed in place: they are views of the padded shard FSDP2 allocated, and a view keeps its base alive."""
    window = _window(param, whole)
    storage = whole.untyped_storage()
    local = local_shard(param)
    param._sharded_param_data = _over(storage, local, window.offset, (window.padded_numel,))
    param.sharded_param._local_tensor = _over(storage, local, window.offset, tuple(local.shape))
