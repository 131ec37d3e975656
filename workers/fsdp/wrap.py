"""FSDP2 wrapping: the mesh, the mixed-precision policy and the per-unit `fully_shard` every sharded model gets
(the trainer's models, the engine API's modules, the strategy API's models)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard

from workers.fsdp_shard_group import shard_group_size

REPLICATE_DIM, SHARD_DIM = "replicate", "shard"
# One mesh per (default process group, device type, shard size): each mesh owns its communicators, so the models of
# one process (actor, reference, critic) share them. Keyed by the group object, as tests start and end groups.
_MESHES: dict[tuple[object, str, int], DeviceMesh] = {}


def device_mesh(device: torch.device, shard_size: int = -1) -> DeviceMesh:
    """The mesh FSDP2 shards over. `shard_size` -1 (or at least the ranks): 1-D over every rank of the default process
    group (ZeRO-3). Smaller: hybrid sharding, a 2-D (replicate, shard) mesh whose shard groups are `shard_size`
    consecutive ranks (within a node when it divides the node's GPUs): FSDP2 gathers and reduce-scatters within a
    group and all-reduces the gradient shards across the groups. ValueError when it does not divide the ranks."""
    world = torch.distributed.get_world_size()
    shard_size = shard_group_size(shard_size, world)
    if shard_size < 1 or world % shard_size:
        raise ValueError(
            f"fsdp_size={shard_size} must be -1 or a divisor of the {world} ranks (each shard group holds that many)"
        )
    group = torch.distributed.group.WORLD
    key = (group, device.type, shard_size)
    if key not in _MESHES:
        for ended in [k for k in _MESHES if k[0] is not group]:  # meshes of an ended process group are of no use
            del _MESHES[ended]
        _MESHES[key] = _new_mesh(device.type, world, shard_size)
    return _MESHES[key]


def _new_mesh(device_type: str, world: int, shard_size: int) -> DeviceMesh:
    if shard_size == world:
        return init_device_mesh(device_type, (world,))
    return init_device_mesh(device_type, (world // shard_size, shard_size), mesh_dim_names=(REPLICATE_DIM, SHARD_DIM))


def units_by_class(module: nn.Module, class_names: Iterable[str] = ()) -> list[nn.Module]:
    """The submodules whose class is named in `class_names`, or, when none are given, in the module's
    `_no_split_modules` (Hugging Face's blocks that stay whole: decoder layers, vision blocks)."""
    names = set(class_names) or set(getattr(module, "_no_split_modules", None) or ())
    return [sub for sub in module.modules() if type(sub).__name__ in names]


def shard_in_units(
    module: nn.Module,
    units: Sequence[nn.Module],
    device: torch.device,
    compute_dtype: torch.dtype | None,
    shard_size: int = -1,
    placement: Callable[[nn.Parameter], Shard | None] | None = None,
) -> None:
    """`fully_shard` each of `units`, then `module` itself (which keeps the rest: embeddings, final norm, head)
    over all ranks, or within groups of `shard_size` (`device_mesh`); the root's wrap also moves parameters and buffers
    to the mesh's device. Units are gathered one at a time in forward and backward, so peak memory holds one unit's
    full weights, not the model's.

    `compute_dtype` other than float32: the (float32 master) parameters are gathered in it for forward and
    backward and gradients are reduced in float32. None or float32: no cast (a frozen model already loaded in
    its compute dtype, or a float32 run). `placement`: FSDP2's `shard_placement_fn`, the dim each parameter is
    sharded on (None: dim 0)."""
    kwargs: dict[str, Any] = {"mesh": device_mesh(device, shard_size)}
    if placement is not None:
        kwargs["shard_placement_fn"] = placement
    if compute_dtype is not None and compute_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(module, **kwargs)
