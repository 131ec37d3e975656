"""What the dispatcher sends to one worker, and how the worker side turns it back into plain arguments.

Envelopes keep the driver from fetching data it only forwards: a `RemoteReshard` names another group's
output chunks by ObjectRef and the worker pulls them straight from the object store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import ray

from single_controller.need_parallel import SplitType, join_values


def padding_in_chunk(total: int, parts: int, index: int) -> int:
    """Rows of padding at the end of chunk `index` when `total` rows are padded up to split in `parts`."""
    chunk = -(-total // parts)  # ceil
    return min(chunk, max(0, (index + 1) * chunk - total))


@dataclass
class PaddedShard:
    """A DataProto chunk (or an ObjectRef to one) whose last `num_padding` rows are padding."""

    data: Any
    num_padding: int


@dataclass
class ExclusiveChunk:
    """An ObjectRef to data that only this one call reads: the worker maps it without copying.

    Nothing else holds the object (the group created it for this call), so in-place writes by the worker
    touch no one else's data. Nested in a dataclass so Ray does not resolve (and copy) it before the call.
    """

    ref: ray.ObjectRef


@dataclass
class RemoteReshard:
    """Chunk `index` of `parts` of the concatenation of DataProto chunks living in the object store."""

    refs: list[ray.ObjectRef]
    index: int
    parts: int


@dataclass
class SplitPart:
    """One worker's piece of a `NeedParallel` argument."""

    value: Any
    split_type: SplitType


@dataclass
class JoinablePart:
    """A worker's output that the driver re-joins with the other workers' along `split_type`."""

    value: Any
    split_type: SplitType


def join_parts(outputs: list[Any]) -> Any:
    """Re-join `JoinablePart` outputs of a SPLIT_JOIN method in rank order."""
    if not outputs:
        return []
    split_type: SplitType = outputs[0].split_type if isinstance(outputs[0], JoinablePart) else "batch"
    values = [o.value if isinstance(o, JoinablePart) else o for o in outputs]
    return join_values(values, split_type)


def is_row_batch(value: Any) -> bool:
    """A value the data-parallel modes split by rows: a DataProto, or a TensorDict with a batch dimension."""
    from tensordict import TensorDictBase

    from protocol import DataProto

    return isinstance(value, DataProto) or (isinstance(value, TensorDictBase) and value.batch_dims >= 1)


def concat_rows(items: list[Any]) -> Any:
    """Concatenate row batches of one kind: DataProtos with DataProto.concat, TensorDicts and tensors on dim 0."""
    import torch

    from protocol import DataProto

    if isinstance(items[0], DataProto):
        return DataProto.concat(items)
    return torch.cat(items, dim=0)


def padded_chunk(value: Any, total: int, parts: int, index: int) -> Any:
    """Chunk `index` of a row batch of `total` rows padded to ceil(total/parts) rows; a view unless it holds padding.

    Padding rows repeat rows from the start, as `pad_dataproto_to_divisor` does, but only the chunks that
    hold padding are copied (as a `PaddedShard`): the full chunks go out as views of the caller's tensors.
    """
    import torch

    size = -(-total // parts)
    start, end = min(index * size, total), min((index + 1) * size, total)
    pad = padding_in_chunk(total, parts, index)
    if not pad:
        return value[start:end]
    first_pad_position = max(index * size, total) - total
    # One indexing copy (not a concat): a DataProto chunk keeps the caller's meta_info as it is.
    positions = torch.cat(
        [torch.arange(start, end), torch.arange(first_pad_position, first_pad_position + pad) % total]
    )
    return PaddedShard(value[positions], pad)


def _resolve_remote_reshard(shard: RemoteReshard) -> tuple[Any, int]:
    chunks = ray.get(shard.refs)
    for position, chunk in enumerate(chunks):
        if not is_row_batch(chunk) or type(chunk) is not type(chunks[0]):
            raise TypeError(
                f"a future handed to this method holds {type(chunk).__name__} at chunk {position}; only "
                "DataProto (or TensorDict) outputs of one kind can be re-split across workers"
            )
    whole = concat_rows(chunks) if len(chunks) > 1 else chunks[0]
    if shard.parts == 1:
        return whole, 0
    chunk = padded_chunk(whole, len(whole), shard.parts, shard.index)
    return (chunk.data, chunk.num_padding) if isinstance(chunk, PaddedShard) else (chunk, 0)


@dataclass
class _ResolvedCall:
    padding: int = 0
    padded_length: int | None = None
    split_type: SplitType | None = None


def _resolve(value: Any, call: _ResolvedCall) -> Any:
    if isinstance(value, ExclusiveChunk):
        from protocol.transport import borrow_received_buffers

        with borrow_received_buffers():
            value = ray.get(value.ref)
    if isinstance(value, PaddedShard):
        data = ray.get(value.data) if isinstance(value.data, ray.ObjectRef) else value.data
        call.padding, call.padded_length = value.num_padding, len(data)
        return data
    if isinstance(value, RemoteReshard):
        data, padding = _resolve_remote_reshard(value)
        if padding:
            call.padding, call.padded_length = padding, len(data)
        return data
    if isinstance(value, SplitPart):
        call.split_type = value.split_type
        return value.value
    return value


def _strip_padding(output: Any, call: _ResolvedCall, method_name: str) -> Any:
    import torch
    from tensordict import TensorDictBase

    from protocol import DataProto

    if isinstance(output, TensorDictBase) and output.batch_dims == 0:
        return output  # metadata only (e.g. metrics as NonTensorData): no rows to strip
    if not isinstance(output, (DataProto, torch.Tensor, TensorDictBase)):
        return output  # e.g. metrics: nothing row-aligned to strip
    if len(output) != call.padded_length:
        raise ValueError(
            f"{method_name} got a chunk of {call.padded_length} rows (the last {call.padding} are padding) "
            f"but returned {type(output).__name__} of {len(output)} rows; a data-parallel method must return one row "
            "per input row so padding can be removed"
        )
    return output[: len(output) - call.padding]


@dataclass
class PreparedCall:
    """A registered method's arguments with the dispatcher's envelopes unwrapped, ready to call."""

    args: tuple
    kwargs: dict
    resolved: _ResolvedCall
    started: float


def prepare_call(args: tuple, kwargs: dict) -> PreparedCall:
    """Worker side, before the method runs: unwrap envelopes (padded shards, remote chunks, split parts)."""
    call = _ResolvedCall()
    args = tuple(_resolve(a, call) for a in args)
    kwargs = {k: _resolve(v, call) for k, v in kwargs.items()}
    return PreparedCall(args, kwargs, call, time.perf_counter())


def finish_call(output: Any, prepared: PreparedCall, func: Callable[..., Any], worker: Any) -> Any:
    """Worker side, after the method returned: record its time, strip padding, tag joinable output."""
    exec_log = getattr(worker, "_sc_exec_seconds", None)
    if exec_log is not None:
        exec_log.append((func.__name__, time.perf_counter() - prepared.started))
    call = prepared.resolved
    if call.padding:
        output = _strip_padding(output, call, func.__qualname__)
    if call.split_type is not None:
        output = JoinablePart(output, call.split_type)
    return output


def run_with_resolved_shards(func: Callable[..., Any], worker: Any, args: tuple, kwargs: dict) -> Any:
    """Worker side of a registered method: unwrap envelopes, call, strip padding, tag joinable output."""
    prepared = prepare_call(args, kwargs)
    return finish_call(func(worker, *prepared.args, **prepared.kwargs), prepared, func, worker)


async def run_with_resolved_shards_async(func: Callable[..., Any], worker: Any, args: tuple, kwargs: dict) -> Any:
    """The same for an `async def` method: its coroutine is awaited on the worker, the driver gets the result."""
    prepared = prepare_call(args, kwargs)
    return finish_call(await func(worker, *prepared.args, **prepared.kwargs), prepared, func, worker)
