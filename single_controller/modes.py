"""Dispatch and execute modes: the names `@register` takes, below both the decorator and the dispatch table."""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Mapping


class Dispatch(str, Enum):
    """Built-in dispatch modes; each names one row of the dispatch table (see `dispatch.py`)."""

    ONE_TO_ALL = "one_to_all"  # every worker gets the same arguments; outputs as a list per rank
    ALL_TO_ALL = "all_to_all"  # arguments are lists with one entry per rank; outputs as a list
    DP_COMPUTE = "dp_compute"  # like ALL_TO_ALL, for data-parallel methods taking pre-split lists
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto split over workers (auto-padded), outputs concatenated
    DP_COMPUTE_METRIC = "dp_compute_metric"  # DataProto split over workers, outputs kept as a list (metrics)
    RANK_ZERO = "rank_zero"  # only rank 0 is called; its output is returned
    SPLIT_JOIN = "split_join"  # NeedParallel arguments split, outputs re-joined in order


class Execute(str, Enum):
    """Which ranks a call reaches."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


# A dispatch mode is a built-in `Dispatch`, the name of a mode added with `register_dispatch_mode`,
# or a custom {"dispatch_fn": f, "collect_fn": g} dict.
DispatchMode = Dispatch | str | Mapping[str, Callable[..., Any]]
