"""Grouping rows by token count: micro-batches under a token budget, and equal-size balanced shards.

Pure functions of the row lengths (real tokens per row); the collective that makes every data-parallel
rank use the same number of micro-batches lives in `workers/training/micro_batching.py`.
"""

from __future__ import annotations

import heapq
import math


def _check_lengths(lengths: list[int], max_tokens: int, setting: str) -> None:
    if max_tokens < 1:
        raise ValueError(f"{setting}={max_tokens} must be >= 1")
    longest = max(lengths, default=0)
    if longest > max_tokens:
        raise ValueError(
            f"{setting}={max_tokens} is smaller than the longest sequence ({longest} tokens); it must be at least "
            "max_prompt_length + max_response_length"
        )


def spread(lengths: list[int], groups: int) -> list[list[int]]:
    """Row indices in `groups` non-empty groups with token sums as even as the longest-first greedy makes
    them: rows from the longest down, each to the group with the fewest tokens (then the fewest rows).
    Each group lists its rows in ascending order."""
    if not 1 <= groups <= len(lengths):
        raise ValueError(f"cannot spread {len(lengths)} rows over {groups} groups (need 1 <= groups <= rows)")
    heap = [(0, 0, g) for g in range(groups)]  # (tokens, rows, group)
    members: list[list[int]] = [[] for _ in range(groups)]
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        tokens, count, group = heapq.heappop(heap)
        members[group].append(row)
        heapq.heappush(heap, (tokens + lengths[row], count + 1, group))
    return [sorted(m) for m in members]


def groups_needed(lengths: list[int], max_tokens: int, at_least: int = 1, setting: str = "max_token_len") -> int:
    """The fewest groups (>= at_least) that `spread` fills with at most `max_tokens` tokens each."""
    _check_lengths(lengths, max_tokens, setting)
    groups = max(at_least, math.ceil(sum(lengths) / max_tokens), 1)
    while groups < len(lengths) and max(sum(lengths[r] for r in g) for g in spread(lengths, groups)) > max_tokens:
        groups += 1
    return min(groups, max(len(lengths), 1))


def equal_size_shards(lengths: list[int], shards: int) -> list[list[int]]:
    """Row indices in `shards` groups of equal row count (rows must divide evenly) with token sums balanced:
    rows from the longest down, each to the shard with the fewest tokens that still has room."""
    if shards < 1 or len(lengths) % shards:
        raise ValueError(f"{len(lengths)} rows cannot be split into {shards} equal shards")
    size = len(lengths) // shards
    heap = [(0, s) for s in range(shards)]
    members: list[list[int]] = [[] for _ in range(shards)]
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        tokens, shard = heapq.heappop(heap)
        members[shard].append(row)
        if len(members[shard]) < size:
            heapq.heappush(heap, (tokens + lengths[row], shard))
    return [sorted(m) for m in members]
