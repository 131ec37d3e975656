"""Dispatch and execute modes: the names `@register` takes, below both the decorator and the dispatch table."""

from __future__ import annotations

from enum import Enum, EnumMeta
from typing import Any, Callable, Mapping

# Names added with `register_dispatch_mode`: `Dispatch.<name>` gives the name back, so a mode registered at
# run time is spelled like a built-in one in `@register(dispatch_mode=Dispatch.MY_MODE)`.
REGISTERED_MODE_NAMES: set[str] = set()


class _DispatchType(EnumMeta):
    def __getattr__(cls, name: str) -> Any:
        if name in REGISTERED_MODE_NAMES:
            return name
        if not name.startswith("_") and name in cls._member_map_:
            return cls._member_map_[name]
        raise AttributeError(
            f"Dispatch has no mode {name!r}; built-in modes: {list(cls._member_map_)}, registered modes: "
            f"{sorted(REGISTERED_MODE_NAMES)} (add one with register_dispatch_mode)"
        )


class Dispatch(str, Enum, metaclass=_DispatchType):
    """Built-in dispatch modes; each names one row of the dispatch table (see `dispatch.py`)."""

    ONE_TO_ALL = "one_to_all"  # every worker gets the same arguments; outputs as a list per rank
    ALL_TO_ALL = "all_to_all"  # arguments are lists with one entry per rank; outputs as a list
    DP_COMPUTE = "dp_compute"  # like ALL_TO_ALL, for data-parallel methods taking pre-split lists
    # DataProto or TensorDict split over workers (auto-padded), outputs concatenated. Each worker returns a
    # DataProto, a TensorDict or a torch.Tensor with one row per row it received (padding rows are stripped);
    # the driver gets one DataProto (meta_info merged as DataProto.concat does), TensorDict or tensor. Anything
    # else (a dict of metrics, a float, None) raises: use DP_COMPUTE_METRIC for per-worker values.
    DP_COMPUTE_PROTO = "dp_compute_proto"
    DP_COMPUTE_METRIC = "dp_compute_metric"  # DataProto/TensorDict split over workers, outputs kept as a list
    RANK_ZERO = "rank_zero"  # only rank 0 is called; its output is returned
    SPLIT_JOIN = "split_join"  # NeedParallel arguments split, outputs re-joined in order


class Execute(str, Enum):
    """Which ranks a call reaches."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


# A dispatch mode is a built-in `Dispatch`, the name of a mode added with `register_dispatch_mode`,
# or a custom {"dispatch_fn": f, "collect_fn": g} dict.
DispatchMode = Dispatch | str | Mapping[str, Callable[..., Any]]
