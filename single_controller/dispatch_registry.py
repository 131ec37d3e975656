"""The dispatch table seen as verl-style `{"dispatch_fn": f, "collect_fn": g}` dicts, and mesh dispatch dicts.

`DISPATCH_MODE_FN_REGISTRY[mode]` gives a mode's two functions, e.g. to wrap a built-in mode in a custom
one; it is read-only (change a mode with `update_dispatch_mode`, add one with `register_dispatch_mode`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Callable

from single_controller.dispatch import entry_for, make_mesh_entry, valid_mode_names
from single_controller.errors import DispatchError
from single_controller.mesh import MeshDispatch
from single_controller.modes import Dispatch

FunctionPair = dict[str, Callable[..., Any]]


def _as_pair(dispatch_fn: Callable[..., Any], collect_fn: Callable[..., Any]) -> FunctionPair:
    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


class _DispatchRegistryView(Mapping):
    """Read-only mapping: built-in `Dispatch` members and registered mode names -> function pair."""

    def __getitem__(self, mode: Dispatch | str) -> FunctionPair:
        entry = entry_for(mode)
        return _as_pair(entry.dispatch_fn, entry.collect_fn)

    def __iter__(self) -> Iterator[Dispatch | str]:
        for name in valid_mode_names():
            yield Dispatch(name) if name in Dispatch._value2member_map_ else name

    def __len__(self) -> int:
        return len(valid_mode_names())

    def __setitem__(self, mode: Any, value: Any) -> None:
        raise DispatchError(
            "DISPATCH_MODE_FN_REGISTRY is read-only: add a mode with register_dispatch_mode(name, dispatch_fn, "
            "collect_fn) or change one with update_dispatch_mode(mode, dispatch_fn, collect_fn)"
        )


DISPATCH_MODE_FN_REGISTRY: Mapping[Dispatch | str, FunctionPair] = _DispatchRegistryView()


def get_predefined_dispatch_fn(dispatch_mode: Dispatch | str) -> FunctionPair:
    """`{"dispatch_fn": f, "collect_fn": g}` of a built-in or registered mode."""
    return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> FunctionPair:
    """Dispatch dict for a mesh the workers registered with `_register_dispatch_collect_info(mesh_name, ...)`
    (or declared with `declare_mesh`): DataProto split over DP ranks, outputs of the collecting ranks
    concatenated. Same behaviour as `MeshDispatch(mesh_name)`."""
    entry = make_mesh_entry(MeshDispatch(mesh_name))
    return _as_pair(entry.dispatch_fn, entry.collect_fn)
