"""The dispatch table seen as verl's `DISPATCH_MODE_FN_REGISTRY` dict, and mesh dispatch dicts.

`DISPATCH_MODE_FN_REGISTRY` behaves like verl's module-level dict: `registry[mode]` gives
`{"dispatch_fn": f, "collect_fn": g}`, and `registry[mode] = {...}`, `del registry[name]`, `update`, `clear`
and `copy` change or snapshot the table itself, so the usual save / restore round trip works:

    saved = DISPATCH_MODE_FN_REGISTRY.copy()      # a plain dict
    register_dispatch_mode("MY_MODE", f, g)       # or update_dispatch_mode(Dispatch.ONE_TO_ALL, f, g)
    DISPATCH_MODE_FN_REGISTRY.clear(); DISPATCH_MODE_FN_REGISTRY.update(saved)

Keys are `Dispatch` members for built-in modes and name strings for registered ones (what `Dispatch.<name>`
returns). As with `update_dispatch_mode`, a change applies to worker groups created afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any, Callable

from single_controller.dispatch import (
    entry_for,
    make_mesh_entry,
    not_registered,
    remove_entry,
    set_entry,
    table_key,
    table_keys,
)
from single_controller.errors import DispatchError
from single_controller.mesh import MeshDispatch
from single_controller.modes import Dispatch

FunctionPair = dict[str, Callable[..., Any]]
_PAIR_KEYS = ("dispatch_fn", "collect_fn")


def _as_pair(dispatch_fn: Callable[..., Any], collect_fn: Callable[..., Any]) -> FunctionPair:
    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


class _DispatchRegistry(MutableMapping):
    """A live dict view of the dispatch table: mode -> `{"dispatch_fn": f, "collect_fn": g}`."""

    def __getitem__(self, mode: Dispatch | str) -> FunctionPair:
        if not isinstance(mode, str) or table_key(mode) not in table_keys():
            raise KeyError(not_registered(mode))
        entry = entry_for(mode)
        return _as_pair(entry.dispatch_fn, entry.collect_fn)

    def __setitem__(self, mode: Dispatch | str, pair: Any) -> None:
        if not isinstance(pair, dict) or set(pair) != set(_PAIR_KEYS):
            raise DispatchError(
                f"DISPATCH_MODE_FN_REGISTRY[{mode!r}] must be a dict with exactly the keys {list(_PAIR_KEYS)}, "
                f"got {pair!r}"
            )
        set_entry(mode, pair["dispatch_fn"], pair["collect_fn"])

    def __delitem__(self, mode: Dispatch | str) -> None:
        remove_entry(mode)

    def __iter__(self) -> Iterator[Dispatch | str]:
        built_in = {m.value: m for m in Dispatch}  # built-in modes as their enum members, custom ones by name
        return iter([built_in.get(key, key) for key in table_keys()])

    def __len__(self) -> int:
        return len(table_keys())

    def copy(self) -> dict[Dispatch | str, FunctionPair]:
        """A plain dict snapshot (later changes to the table do not show in it)."""
        return dict(self.items())

    def __repr__(self) -> str:
        return f"DISPATCH_MODE_FN_REGISTRY({sorted(str(k) for k in self)})"


DISPATCH_MODE_FN_REGISTRY: MutableMapping[Dispatch | str, FunctionPair] = _DispatchRegistry()


def get_predefined_dispatch_fn(dispatch_mode: Dispatch | str) -> FunctionPair:
    """`{"dispatch_fn": f, "collect_fn": g}` of a built-in or registered mode."""
    return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> FunctionPair:
    """Dispatch dict for a mesh the workers registered with `_register_dispatch_collect_info(mesh_name, ...)`
    (or declared with `declare_mesh`): DataProto split over DP ranks, outputs of the collecting ranks
    concatenated. Same behaviour as `MeshDispatch(mesh_name)`."""
    entry = make_mesh_entry(MeshDispatch(mesh_name))
    return _as_pair(entry.dispatch_fn, entry.collect_fn)
