"""The dispatch table: for each mode, how arguments are split per rank and how outputs are collected.

A dispatch function takes `(worker_group, *args, **kwargs)` and returns `(args, kwargs)` in which every
value is a list with one entry per rank of the group. A collect function takes `(worker_group, outputs)`,
the outputs of the ranks that ran, in rank order. Both run on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from single_controller.errors import DispatchError
from single_controller.mesh import MeshDispatch, MeshPlacement
from single_controller.modes import REGISTERED_MODE_NAMES, Dispatch, DispatchMode
from single_controller.need_parallel import NeedParallel, split_value
from single_controller.shards import RemoteReshard, SplitPart, concat_rows, is_row_batch, join_parts, padded_chunk


class GroupView(Protocol):
    """What dispatch and collect functions may ask of a worker group."""

    name: str
    world_size: int

    def mesh_placements(self, mesh_name: str) -> list[MeshPlacement]: ...


DispatchFn = Callable[..., tuple[tuple, dict]]
CollectFn = Callable[[Any, list], Any]


@dataclass(frozen=True)
class DispatchEntry:
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    # Picks, from the refs of all ranks that ran, the ones holding DataProto chunks in data order, so a
    # non-blocking result can be handed to another group without the driver fetching it.
    chunk_refs: Callable[[Any, list], list] | None = None
    joins_parts: bool = False  # collect_fn wants the workers' JoinablePart outputs as they are


def _map_args(fn: Callable[[Any], list], args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return tuple(fn(a) for a in args), {k: fn(v) for k, v in kwargs.items()}


def _broadcast_or_split(group: GroupView, value: Any) -> list:
    """Whole value to every rank, except `NeedParallel` values, which are split (and futures, kept remote)."""
    from protocol import DataProtoFuture

    n = group.world_size
    if isinstance(value, NeedParallel):
        return [SplitPart(part, value.type) for part in split_value(value.value, n, value.type)]
    if isinstance(value, DataProtoFuture):
        if value.chunk_refs is not None:
            return [RemoteReshard(value.chunk_refs, 0, 1)] * n
        value = value.get()
    return [value] * n


def shard_dataproto(value: Any, parts: int, where: str) -> list:
    """Split a DataProto or TensorDict (or a future of one) into `parts` equal chunks, padding the tail if needed."""
    from protocol import DataProtoFuture

    if isinstance(value, DataProtoFuture):
        if value.chunk_refs is None:
            value = value.get()
        elif len(value.chunk_refs) == parts:
            return list(value.chunk_refs)  # worker i reads the producer's chunk i directly
        else:
            return [RemoteReshard(value.chunk_refs, i, parts) for i in range(parts)]
    if not is_row_batch(value):
        got = type(value).__name__
        if hasattr(value, "batch_size"):
            got += f" with batch_size {list(value.batch_size)} (it needs a batch dimension to split)"
        raise TypeError(
            f"{where} expects DataProto or TensorDict (or DataProtoFuture) arguments to split across workers, got "
            f"{got}; wrap plain values in NeedParallel with Dispatch.ONE_TO_ALL or Dispatch.SPLIT_JOIN instead"
        )
    total = len(value)
    if total == 0:
        raise ValueError(
            f"{where} got an empty {type(value).__name__}; there is nothing to split across {parts} workers"
        )
    return [padded_chunk(value, total, parts, i) for i in range(parts)]


def _check_same_length(args: tuple, kwargs: dict, where: str) -> None:
    lengths = {name: len(v) for name, v in [*enumerate(args), *kwargs.items()] if is_row_batch(v)}
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"argument {k!r}: {n} rows" for k, n in lengths.items())
        raise ValueError(
            f"{where} splits its DataProto/TensorDict arguments together, but their lengths differ ({described})"
        )


# ---- built-in modes ----------------------------------------------------------------------------------


def dispatch_one_to_all(group: GroupView, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return _map_args(lambda v: _broadcast_or_split(group, v), args, kwargs)


def dispatch_all_to_all(group: GroupView, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    n = group.world_size

    def check(value: Any) -> list:
        if not isinstance(value, (list, tuple)) or len(value) != n:
            got = (
                f"{type(value).__name__} of length {len(value)}" if hasattr(value, "__len__") else type(value).__name__
            )
            raise ValueError(
                f"ALL_TO_ALL/DP_COMPUTE methods of group {group.name!r} take one list entry per worker "
                f"(lists of length {n}); got {got}"
            )
        return list(value)

    return _map_args(check, args, kwargs)


def dispatch_dp_proto(group: GroupView, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    where = f"a DP_COMPUTE_PROTO method of group {group.name!r}"
    _check_same_length(args, kwargs, where)
    return _map_args(lambda v: shard_dataproto(v, group.world_size, where), args, kwargs)


def collect_list(group: GroupView, outputs: list) -> list:
    return list(outputs)


def collect_first(group: GroupView, outputs: list) -> Any:
    return outputs[0]


def concat_dataprotos(outputs: Sequence[Any], where: str) -> Any:
    """Concatenate per-chunk outputs: DataProtos into one DataProto, TensorDicts and tensors along the batch axis.

    TensorDicts without a batch dimension (metadata only) are not concatenated: the first is returned, as verl does.
    """
    import torch
    from tensordict import TensorDictBase

    from protocol import DataProto

    kinds = (DataProto, TensorDictBase, torch.Tensor)
    kind = next((k for k in kinds if isinstance(outputs[0], k)), torch.Tensor)
    for rank, output in enumerate(outputs):
        if not isinstance(output, kind):
            raise TypeError(
                f"{where} must return a DataProto, TensorDict or tensor (the same kind) from every worker to be "
                f"concatenated, but output {rank} is {type(output).__name__}; register it with "
                "Dispatch.DP_COMPUTE_METRIC to get a list"
            )
    if kind is TensorDictBase and all(output.batch_dims == 0 for output in outputs):
        return outputs[0]
    return concat_rows(list(outputs))


def collect_dp_proto(group: GroupView, outputs: list) -> Any:
    from protocol.transport import borrow_received_buffers

    # The concatenation copies every chunk once more, so the received chunks need no private copy.
    with borrow_received_buffers():
        return concat_dataprotos(outputs, f"a DP_COMPUTE_PROTO method of group {group.name!r}")


def collect_split_join(group: GroupView, outputs: list) -> Any:
    return join_parts(outputs)


# ---- mesh-aware modes ---------------------------------------------------------------------------------


def make_mesh_entry(mode: MeshDispatch) -> DispatchEntry:
    """DP-only split for a declared mesh: same chunk for every rank of a DP group, one output per group."""

    def dispatch(group: GroupView, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        placements = group.mesh_placements(mode.mesh_name)
        dp_size = placements[0].dp_size
        where = f"a method of group {group.name!r} dispatched over mesh {mode.mesh_name!r}"
        _check_same_length(args, kwargs, where)

        def per_rank(value: Any) -> list:
            chunks = shard_dataproto(value, dp_size, where)
            return [chunks[p.dp_rank] for p in placements]

        return _map_args(per_rank, args, kwargs)

    def collector_order(group: GroupView, items: list) -> list:
        placements = group.mesh_placements(mode.mesh_name)
        chosen = sorted((p.dp_rank, item) for p, item in zip(placements, items, strict=True) if p.is_collector)
        return [item for _, item in chosen]

    def collect(group: GroupView, outputs: list) -> Any:
        from protocol.transport import borrow_received_buffers

        if mode.outputs == "list":
            return collector_order(group, outputs)
        with borrow_received_buffers():
            return concat_dataprotos(collector_order(group, outputs), f"mesh {mode.mesh_name!r} method")

    return DispatchEntry(dispatch, collect, chunk_refs=collector_order)


# ---- the table ------------------------------------------------------------------------------------------

_TABLE: dict[str, DispatchEntry] = {
    Dispatch.ONE_TO_ALL.value: DispatchEntry(dispatch_one_to_all, collect_list),
    Dispatch.ALL_TO_ALL.value: DispatchEntry(dispatch_all_to_all, collect_list),
    Dispatch.DP_COMPUTE.value: DispatchEntry(dispatch_all_to_all, collect_list),
    Dispatch.DP_COMPUTE_PROTO.value: DispatchEntry(dispatch_dp_proto, collect_dp_proto, chunk_refs=collect_list),
    Dispatch.DP_COMPUTE_METRIC.value: DispatchEntry(dispatch_dp_proto, collect_list),
    Dispatch.RANK_ZERO.value: DispatchEntry(dispatch_one_to_all, collect_first),
    Dispatch.SPLIT_JOIN.value: DispatchEntry(dispatch_one_to_all, collect_split_join, joins_parts=True),
}

# The built-in entries as first defined: a pair of their functions written back (e.g. restoring a copy of
# DISPATCH_MODE_FN_REGISTRY) gets the whole entry back, with its chunk_refs / joins_parts.
_BUILT_IN_ENTRIES = tuple(_TABLE.values())

_CUSTOM_KEYS = {"dispatch_fn", "collect_fn"}


def register_dispatch_mode(name: str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> str:
    """Add a named dispatch mode, usable as `@register(dispatch_mode=name)` or `Dispatch.<name>`.

    Returns the name. Groups bind a method's dispatch functions when they are created.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise DispatchError(f"a dispatch mode name must be an identifier string, got {name!r}")
    if name in _TABLE or name in Dispatch.__members__:
        raise DispatchError(f"dispatch mode {name!r} already exists; registered modes: {valid_mode_names()}")
    _check_callables("register_dispatch_mode", dispatch_fn, collect_fn)
    _TABLE[name] = DispatchEntry(dispatch_fn, collect_fn)
    REGISTERED_MODE_NAMES.add(name)
    return name


def update_dispatch_mode(dispatch_mode: Dispatch | str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> None:
    """Replace the functions of an existing mode (built-in or registered) for groups created afterwards."""
    key = dispatch_mode.value if isinstance(dispatch_mode, Dispatch) else dispatch_mode
    if not isinstance(key, str) or key not in _TABLE:
        raise DispatchError(not_registered(dispatch_mode))
    _check_callables("update_dispatch_mode", dispatch_fn, collect_fn)
    _TABLE[key] = DispatchEntry(dispatch_fn, collect_fn)


def table_key(mode: Any) -> str:
    """The table key of a mode: a `Dispatch` member's value, a member's name, or a registered mode's name."""
    if isinstance(mode, Dispatch):
        return mode.value
    if isinstance(mode, str) and mode in Dispatch.__members__:
        return Dispatch.__members__[mode].value
    if isinstance(mode, str):
        return mode
    raise DispatchError(
        f"a dispatch mode is a Dispatch member or a mode name (str), got {type(mode).__name__} {mode!r}"
    )


def table_keys() -> list[str]:
    return list(_TABLE)


def set_entry(mode: Any, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> None:
    """Add or replace a mode's functions (what `DISPATCH_MODE_FN_REGISTRY[mode] = {...}` does)."""
    key = table_key(mode)
    if key not in _TABLE and not key.isidentifier():
        raise DispatchError(f"a dispatch mode name must be an identifier string, got {mode!r}")
    _check_callables("DISPATCH_MODE_FN_REGISTRY", dispatch_fn, collect_fn)
    same_functions = [
        e
        for e in (_TABLE.get(key), *_BUILT_IN_ENTRIES)
        if e and (e.dispatch_fn, e.collect_fn) == (dispatch_fn, collect_fn)
    ]
    _TABLE[key] = same_functions[0] if same_functions else DispatchEntry(dispatch_fn, collect_fn)
    if key not in {m.value for m in Dispatch}:
        REGISTERED_MODE_NAMES.add(key)


def remove_entry(mode: Any) -> None:
    """Remove a mode (`del DISPATCH_MODE_FN_REGISTRY[mode]`); `Dispatch.<name>` of a removed name then raises."""
    key = table_key(mode)
    if key not in _TABLE:
        raise KeyError(not_registered(mode))
    del _TABLE[key]
    REGISTERED_MODE_NAMES.discard(key)


def _check_callables(where: str, dispatch_fn: Any, collect_fn: Any) -> None:
    if not callable(dispatch_fn) or not callable(collect_fn):
        raise DispatchError(
            f"{where} needs callable dispatch_fn and collect_fn, got {type(dispatch_fn).__name__} and "
            f"{type(collect_fn).__name__}"
        )


def entry_for(mode: Dispatch | str) -> DispatchEntry:
    """The table entry of a built-in or registered mode (KeyError-free: raises DispatchError)."""
    key = table_key(mode)
    if key not in _TABLE:
        raise DispatchError(not_registered(mode))
    return _TABLE[key]


def valid_mode_names() -> list[str]:
    return sorted(_TABLE)


def not_registered(mode: Any) -> str:
    return f"dispatch mode {mode!r} is not registered; registered modes: {valid_mode_names()}"


def _unknown(mode: Any) -> str:
    return (
        f"unknown dispatch mode {mode!r}; valid modes: {valid_mode_names()}, a MeshDispatch(name), or a "
        "{'dispatch_fn': f, 'collect_fn': g} dict"
    )


def resolve_dispatch(mode: DispatchMode | MeshDispatch) -> DispatchEntry:
    """Look a mode up in the table (or build the entry of a custom dict or a mesh)."""
    if isinstance(mode, MeshDispatch):
        return make_mesh_entry(mode)
    if isinstance(mode, Mapping):
        keys = set(mode)
        if keys != _CUSTOM_KEYS:
            raise DispatchError(
                f"a custom dispatch mode is a dict with exactly the keys {sorted(_CUSTOM_KEYS)}; got {sorted(keys)}"
            )
        if not callable(mode["dispatch_fn"]) or not callable(mode["collect_fn"]):
            raise TypeError("custom dispatch mode: 'dispatch_fn' and 'collect_fn' must be callable")
        return DispatchEntry(mode["dispatch_fn"], mode["collect_fn"])
    key = mode.value if isinstance(mode, Dispatch) else mode
    if key not in _TABLE:
        raise DispatchError(_unknown(mode))
    return _TABLE[key]


def validate_dispatch_mode(mode: Any) -> None:
    """Fail at decoration time (with the valid choices) rather than at the first call."""
    if isinstance(mode, Mapping):
        resolve_dispatch(mode)
    # Named modes may be registered after the decorator runs; Dispatch members always exist.
    elif not (isinstance(mode, (MeshDispatch, Dispatch)) or (isinstance(mode, str) and mode in _TABLE)):
        raise DispatchError(_unknown(mode))
