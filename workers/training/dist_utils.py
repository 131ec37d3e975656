"""Small collectives the workers need: equal work on every rank, and metrics averaged over ranks."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from typing import Iterator, Mapping

import torch
import torch.distributed as dist


def check_same_length(length: int, device: torch.device, method: str) -> None:
    """Fail on every rank (instead of hanging in an FSDP all-gather) when ranks got different row counts.

    The DP dispatch pads chunks to equal length, so this only fires for callers that bypass it; every
    rank runs the same number of forward passes only if every rank holds the same number of rows.
    """
    bounds = reduce_over_ranks({"longest": length, "shortest": length}, device, {"longest": "max", "shortest": "min"})
    longest, shortest = int(bounds["longest"]), int(bounds["shortest"])
    if longest != shortest:
        raise ValueError(
            f"{method}: ranks received between {shortest} and {longest} rows; FSDP needs the same number of "
            "rows (hence forward passes) on every rank. Call it through the worker group's DP dispatch, which "
            "pads the chunks to equal length"
        )


def _single(group: dist.ProcessGroup | None) -> bool:
    return not dist.is_initialized() or dist.get_world_size(group) == 1


def mean_over_ranks(
    metrics: dict[str, float], device: torch.device, group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """Average each metric over the ranks of `group` (default: all; one all-reduce), so every rank returns the
    global value."""
    if not metrics or _single(group):
        return dict(metrics)
    keys = sorted(metrics)
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
    values /= dist.get_world_size(group)
    return {k: float(v) for k, v in zip(keys, values.tolist())}


def reduce_over_ranks(
    metrics: dict[str, float], device: torch.device, extremes: Mapping[str, str], group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """`mean_over_ranks`, except the metrics named in `extremes` ("max" / "min"), which take the extreme."""
    named = {k: extremes[k] for k in metrics if k in extremes}
    averaged = mean_over_ranks({k: v for k, v in metrics.items() if k not in named}, device, group)
    if not named or _single(group):
        return {**averaged, **{k: metrics[k] for k in named}}
    keys = sorted(named)
    # One MAX all-reduce: a minimum is the negated maximum of the negated values.
    signs = torch.tensor([1.0 if named[k] == "max" else -1.0 for k in keys], dtype=torch.float64, device=device)
    values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device) * signs
    dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
    return {**averaged, **{k: float(v) for k, v in zip(keys, (values * signs).tolist())}}


@contextmanager
def single_process_group(device: torch.device) -> Iterator[None]:
    """A one-rank default process group, so an `FSDPBackend` runs inside this process (benchmarks, tests)."""
    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as folder:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
