"""Ulysses sequence parallelism for packed forwards: one packed row split over the k ranks of a group.

Each rank of the group runs the model on a contiguous k-th of the packed tokens (the row padded to a
multiple of k; the padding is a sequence of its own in `cu_seq_lens`, so it attends only to itself and no
real token attends to it). Everything but attention works token by token, so it runs on the shard as it
is; the rotary embeddings come from the shard's own slice of the position ids. Attention needs whole
sequences: inside it an all-to-all turns queries, keys and values [1, heads, T/k, D] of the rank's tokens
into [1, heads/k, T, D] (every token, a k-th of the heads), the varlen kernel runs with the offsets of the
whole row, and a second all-to-all gives each rank its own tokens back with every head
(`workers/packing/attention.py`). Key/value heads are split the same way or, when there are fewer of them
than k, repeated up to k first (each rank's query heads still read the key/value head they read at k=1).

Per-token outputs (log-probs, entropies, values) are gathered back to the whole row on every rank of the
group (`gather_shards`): the loss code sees what it sees at k=1. The gather's backward sums the gradients
over the group, so with the same loss on all k ranks the group computes the gradient of k x that loss;
FSDP's average over all dp x k ranks turns it back into the data-parallel average (workers/training/ppo_loop.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workers.packing.layout import PackedRows

# The keyword argument that carries the group through the model's forward to the packed attention.
SEQUENCE_PARALLEL_KWARG = "sequence_parallel"


@dataclass(frozen=True, eq=False)
class SequenceParallel:
    """This rank's sequence-parallel group: `size` consecutive ranks that share one packed row."""

    group: dist.ProcessGroup
    size: int
    rank: int  # within the group


# One group per size and process group: colocated roles with the same size share its communicator.
_GROUPS: dict[int, tuple[Any, SequenceParallel]] = {}


def sequence_parallel_group(size: int) -> SequenceParallel | None:
    """The group of `size` consecutive ranks holding this rank (ranks g*size .. g*size + size - 1), or None
    for size 1. Collective the first time for a size: every rank calls it, in the same order."""
    if size == 1:
        return None
    world = dist.get_world_size()
    if size < 1 or world % size:
        raise ValueError(f"ulysses_sequence_parallel_size={size} must be >= 1 and divide the {world} ranks")
    cached = _GROUPS.get(size)
    if cached is not None and cached[0] is dist.group.WORLD:
        return cached[1]
    group, _ = dist.new_subgroups(group_size=size)
    sequence_parallel = SequenceParallel(group, size, dist.get_rank(group))
    _GROUPS[size] = (dist.group.WORLD, sequence_parallel)
    return sequence_parallel


def valid_sizes(heads: int, kv_heads: int) -> list[int]:
    """Group sizes that split `heads` query heads and `kv_heads` key/value heads."""
    return [k for k in range(1, heads + 1) if heads % k == 0 and (kv_heads % k == 0 or k % kv_heads == 0)]


def check_heads(heads: int, kv_heads: int, size: int, where: str) -> None:
    """The group size must divide the attention heads, and divide the key/value heads or be a multiple of
    them (then they are repeated up to `size`)."""
    if size not in valid_sizes(heads, kv_heads):
        raise ValueError(
            f"{where}={size} cannot split the model's {heads} attention heads ({kv_heads} key/value heads) over {size} "
            f"ranks: it must divide the attention heads, and divide the key/value heads or be a multiple of them; "
            f"valid sizes: {valid_sizes(heads, kv_heads)}"
        )


# ---- all-to-all around attention ------------------------------------------------------------------------


def _all_to_all(x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Part i of `x` along scatter_dim goes to rank i; the parts received are joined along gather_dim in rank order."""
    sends = [part.contiguous() for part in torch.tensor_split(x, sp.size, dim=scatter_dim)]
    receives = [torch.empty_like(sends[0]) for _ in range(sp.size)]
    dist.all_to_all(receives, sends, group=sp.group)
    return torch.cat(receives, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """The all-to-all; its backward is the all-to-all the other way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.sp = sp
        ctx.dims = (scatter_dim, gather_dim)
        return _all_to_all(x, sp, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, ctx.sp, gather_dim, scatter_dim), None, None, None


def heads_to_sequence(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """[1, h, T/k, D] (this rank's tokens, every head) -> [1, h/k, T, D] (every token, this rank's heads).
    Key/value heads fewer than k are repeated up to k first."""
    heads = x.shape[1]
    if heads % sp.size:
        x = x.repeat_interleave(sp.size // heads, dim=1)
    return _AllToAll.apply(x, sp, 1, 2)


def sequence_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """Attention output [1, T, H/k, D] (every token, this rank's heads) -> [1, T/k, H, D]."""
    return _AllToAll.apply(x, sp, 1, 2)


# ---- the row's shards and the outputs gathered back ------------------------------------------------------


class _GatherShards(torch.autograd.Function):
    """Every rank's [counts[r], ...] -> the whole [sum(counts), ...] on every rank; backward: the gradients of
    all ranks summed, this rank's part."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, sp: SequenceParallel, counts: tuple[int, ...]) -> torch.Tensor:
        ctx.sp = sp
        ctx.counts = counts
        width = max(counts)
        padded = local.new_zeros((width, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(sp.size)]
        dist.all_gather(parts, padded, group=sp.group)
        return torch.cat([part[:count] for part, count in zip(parts, counts)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        summed = grad.contiguous().clone()
        dist.all_reduce(summed, group=ctx.sp.group)
        start = sum(ctx.counts[: ctx.sp.rank])
        return summed[start : start + ctx.counts[ctx.sp.rank]], None, None


def gather_shards(local: torch.Tensor, sp: SequenceParallel, counts: list[int]) -> torch.Tensor:
    """Concatenate the ranks' per-token tensors (dim 0, `counts[r]` rows from rank r) on every rank."""
    if local.shape[0] != counts[sp.rank]:
        raise ValueError(
            f"rank {sp.rank} of the sequence-parallel group holds {local.shape[0]} rows, expected {counts[sp.rank]}"
        )
    if max(counts) == 0:
        return local
    return _GatherShards.apply(local, sp, tuple(counts))


@dataclass(frozen=True)
class RowShard:
    """This rank's part of a packed row padded to a multiple of the group size: tokens [start, stop)."""

    inputs: dict[str, Any]  # model keyword arguments of the shard (the packed attention's offsets cover the whole row)
    start: int
    stop: int
    padded_tokens: int
    size: int

    @property
    def width(self) -> int:
        return self.stop - self.start

    def counts(self, positions: torch.Tensor) -> list[int]:
        """How many of the (ascending) packed `positions` lie in each rank's shard."""
        return torch.bincount(positions // self.width, minlength=self.size).tolist() if self.width else [0] * self.size

    def local(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(which of the ascending `positions` lie in this shard [K] bool, their positions within it)."""
        mine = (positions >= self.start) & (positions < self.stop)
        return mine, positions[mine] - self.start


def shard_packed_row(rows: PackedRows, sp: SequenceParallel) -> RowShard:
    """This rank's shard of the packed row, with the offsets of the whole (padded) row for attention."""
    total = rows.num_tokens
    padded = math.ceil(total / sp.size) * sp.size
    pad = padded - total
    input_ids = rows.input_ids
    position_ids = rows.position_ids
    cu_seq_lens = rows.cu_seq_lens
    max_length = rows.max_length
    if pad:
        # The padding is one more sequence: token 0 at positions 0..pad-1; its outputs are never read.
        input_ids = F.pad(input_ids, (0, pad))
        pad_positions = torch.arange(pad, device=position_ids.device, dtype=position_ids.dtype)
        position_ids = torch.cat([position_ids, pad_positions[None]], dim=1)
        cu_seq_lens = torch.cat([cu_seq_lens, cu_seq_lens.new_tensor([padded])])
        max_length = max(max_length, pad)
    width = padded // sp.size
    start, stop = sp.rank * width, (sp.rank + 1) * width
    inputs = {
        **rows.model_inputs(),
        "input_ids": input_ids[:, start:stop],
        "position_ids": position_ids[:, start:stop],
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": max_length,
        "max_length_k": max_length,
        SEQUENCE_PARALLEL_KWARG: sp,
    }
    return RowShard(inputs, start, stop, padded, sp.size)
