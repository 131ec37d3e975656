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


def _resolve_remote_reshard(shard: RemoteReshard) -> tuple[Any, int]:
    from protocol import DataProto
    from protocol.padding import pad_dataproto_to_divisor

    chunks = ray.get(shard.refs)
    for position, chunk in enumerate(chunks):
        if not isinstance(chunk, DataProto):
            raise TypeError(
                f"a future handed to this method holds {type(chunk).__name__} at chunk {position}; only "
                "DataProto outputs can be re-split across workers"
            )
    whole = DataProto.concat(chunks) if len(chunks) > 1 else chunks[0]
    if shard.parts == 1:
        return whole, 0
    padded, _ = pad_dataproto_to_divisor(whole, shard.parts)
    return padded.chunk(shard.parts)[shard.index], padding_in_chunk(len(whole), shard.parts, shard.index)


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

    from protocol import DataProto

    if not isinstance(output, (DataProto, torch.Tensor)):
        return output  # e.g. metrics: nothing row-aligned to strip
    if len(output) != call.padded_length:
        raise ValueError(
            f"{method_name} got a chunk of {call.padded_length} rows (the last {call.padding} are padding) "
            f"but returned {type(output).__name__} of {len(output)} rows; a data-parallel method must return one row "
            "per input row so padding can be removed"
        )
    return output[: len(output) - call.padding]


def run_with_resolved_shards(func: Callable[..., Any], worker: Any, args: tuple, kwargs: dict) -> Any:
    """Worker side of a registered method: unwrap envelopes, call, strip padding, tag joinable output."""
    call = _ResolvedCall()
    args = tuple(_resolve(a, call) for a in args)
    kwargs = {k: _resolve(v, call) for k, v in kwargs.items()}
    started = time.perf_counter()
    output = func(worker, *args, **kwargs)
    exec_log = getattr(worker, "_sc_exec_seconds", None)
    if exec_log is not None:
        exec_log.append((func.__name__, time.perf_counter() - started))
    if call.padding:
        output = _strip_padding(output, call, func.__qualname__)
    if call.split_type is not None:
        output = JoinablePart(output, call.split_type)
    return output
