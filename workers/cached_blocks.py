"""Handing the caching allocator's unused blocks back to the device between micro-batches or after a phase's last
one (the limit and the choices are in workers/cached_blocks_limit.py, free of torch, for the memory plan)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from workers.cached_blocks_limit import AFTER_MICRO_BATCH, CACHED_BLOCKS_LIMIT, RELEASE_POINTS

# Process-wide, like the caching allocator it governs (colocated roles share one process and one allocator).
_release_point = AFTER_MICRO_BATCH


def set_release_point(point: str) -> None:
    """When the workers of this process check the allocator's reserve: `after_micro_batch` or `after_phase`."""
    global _release_point
    if point not in RELEASE_POINTS:
        raise ValueError(f"release_cached_blocks={point!r} is not valid; choose one of {list(RELEASE_POINTS)}")
    _release_point = point


@contextmanager
def release_point_during(point: str) -> Iterator[None]:
    """`set_release_point` for a block of code run in a process that keeps going (a benchmark called from a
    test), the point before it restored afterwards."""
    before = _release_point
    set_release_point(point)
    try:
        yield
    finally:
        set_release_point(before)


def release_after_micro_batch(device: torch.device) -> bool:
    """`release_cached_blocks` where the release point is every micro-batch; False (nothing done) otherwise."""
    return _release_point == AFTER_MICRO_BATCH and release_cached_blocks(device)


def release_cached_blocks(device: torch.device, limit: int = CACHED_BLOCKS_LIMIT) -> bool:
    """Return the caching allocator's free blocks to the device when it reserves more than `limit` bytes beyond
    the highest it ever had allocated at once (since the last peak reset); whether it did.

    Long micro-batches of slightly different token counts leave blocks the next one cannot reuse: at 7B with
    66K-token micro-batches the allocator reserved 33 GiB for an 11.6 GiB peak on an H100, and the device's use
    (what the sleeping engine's wake-up and other processes see) followed the reserve. Where blocks are reused
    (equal shapes), the reserve stays at the peak and nothing is freed, so the next micro-batch does not pay
    for new device allocations.
    """
    if device.type != "cuda":
        return False
    if torch.cuda.memory_reserved(device) - torch.cuda.max_memory_allocated(device) <= limit:
        return False
    torch.cuda.empty_cache()
    return True
