"""Device meshes declared by workers: which data-parallel chunk a rank gets and whether its output counts."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from single_controller.errors import DispatchError


@dataclass(frozen=True)
class MeshPlacement:
    """One rank's place in a DP x TP x PP (or any named-axes) mesh, as seen by the dispatcher."""

    dp_rank: int
    dp_size: int | None  # None when a worker registered its DP rank alone; the group fills it in
    is_collector: bool  # the single rank of its DP group whose output is collected


def complete_placements(placements: list[MeshPlacement], mesh_name: str) -> list[MeshPlacement]:
    """All ranks' placements with dp_size filled in (max DP rank + 1 where a rank left it out), checked:
    one DP size, every DP rank used, and exactly one collecting rank per DP rank."""
    dp_size = max(p.dp_rank for p in placements) + 1
    placements = [p if p.dp_size is not None else replace(p, dp_size=dp_size) for p in placements]
    sizes = sorted({p.dp_size for p in placements})
    collectors = [sum(1 for p in placements if p.dp_rank == d and p.is_collector) for d in range(dp_size)]
    if sizes != [dp_size] or any(count != 1 for count in collectors):
        described = [(rank, p.dp_rank, p.is_collector) for rank, p in enumerate(placements)]
        raise DispatchError(
            f"mesh {mesh_name!r} is inconsistent: each of DP ranks 0..{dp_size - 1} needs exactly one collecting "
            f"rank (got {collectors} collectors per DP rank, DP sizes {sizes}); "
            f"(rank, dp_rank, is_collect) = {described}"
        )
    return placements


def placement_from_axes(
    rank: int,
    shape: Mapping[str, int],
    dp_axis: str = "dp",
    collect_from: Mapping[str, int] | None = None,
) -> MeshPlacement:
    """Place `rank` in a row-major mesh with the named axes of `shape` (first axis slowest).

    `collect_from` gives, for each non-DP axis, the index whose rank's output is collected (negative
    counts from the end); by default TP rank 0 of the last PP stage, as Megatron-style models produce.
    """
    if dp_axis not in shape:
        raise ValueError(f"mesh axes {list(shape)} do not contain the data-parallel axis {dp_axis!r}")
    for axis, size in shape.items():
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh axis {axis!r} has size {size!r}; sizes must be positive integers")
    world = math.prod(shape.values())
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a mesh of {world} ranks ({dict(shape)})")
    # By default collect from index 0 on every non-DP axis, except the last pipeline stage ('pp': -1).
    wanted = {axis: (-1 if axis == "pp" else 0) for axis in shape if axis != dp_axis}
    if collect_from is not None:
        unknown = set(collect_from) - set(shape) | ({dp_axis} & set(collect_from))
        if unknown:
            raise ValueError(
                f"collect_from names axes {sorted(unknown)}; valid are the non-DP axes "
                f"{[a for a in shape if a != dp_axis]}"
            )
        wanted.update(collect_from)

    coords: dict[str, int] = {}
    remainder = rank
    for axis in reversed(list(shape)):
        remainder, coords[axis] = divmod(remainder, shape[axis])
    is_collector = all(coords[axis] == index % shape[axis] for axis, index in wanted.items())
    return MeshPlacement(dp_rank=coords[dp_axis], dp_size=shape[dp_axis], is_collector=is_collector)


MESH_OUTPUTS = ("concat", "list")


@dataclass(frozen=True)
class MeshDispatch:
    """Dispatch mode for a mesh a worker declares at run time with `Worker.declare_mesh(name, ...)`.

    DataProto arguments are split over the DP axis only; every TP/PP rank of a DP group gets the same
    chunk; outputs are collected from the one collector rank of each DP group, in DP order, and
    concatenated (`outputs="concat"`: DataProtos or tensors) or returned as a list (`outputs="list"`:
    e.g. one metrics dict per DP group).
    """

    mesh_name: str
    outputs: str = "concat"

    def __post_init__(self) -> None:
        if self.outputs not in MESH_OUTPUTS:
            raise ValueError(f"MeshDispatch outputs={self.outputs!r}; valid: {list(MESH_OUTPUTS)}")
