"""`DataProtoFuture`: the not-yet-fetched result of a non-blocking worker-group call."""

from __future__ import annotations

from typing import Any, Callable

import ray


class DataProtoFuture:
    """Outputs still in Ray's object store, plus how to collect them.

    `get()` fetches and collects on the driver. Passing the future to another group's data-parallel method
    instead hands the chunks (`chunk_refs`) from worker to worker: the driver never holds the data.
    """

    def __init__(
        self,
        refs: list[ray.ObjectRef],
        collect_fn: Callable[[list[Any]], Any],
        fetch_fn: Callable[[list[ray.ObjectRef]], list[Any]] = ray.get,
        chunk_refs: list[ray.ObjectRef] | None = None,
        description: str = "",
    ) -> None:
        self.refs = list(refs)
        self.collect_fn = collect_fn
        self.fetch_fn = fetch_fn
        # Refs holding DataProto chunks in data order, when the outputs are such chunks.
        self.chunk_refs = list(chunk_refs) if chunk_refs is not None else None
        self.description = description

    def get(self) -> Any:
        """Wait for every worker, then collect (e.g. concatenate) their outputs."""
        return self.collect_fn(self.fetch_fn(self.refs))

    def done(self) -> bool:
        """True when every output is ready (nothing is fetched)."""
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0, fetch_local=False)
        return len(ready) == len(self.refs)

    def __reduce__(self) -> Any:
        raise TypeError(
            f"a DataProtoFuture ({self.description or 'worker-group result'}) cannot be sent inside another "
            "object; pass it directly as an argument of a worker-group method, or call .get() first"
        )

    def __repr__(self) -> str:
        handoff = f", {len(self.chunk_refs)} chunks" if self.chunk_refs is not None else ""
        return f"DataProtoFuture({self.description or 'result'}, {len(self.refs)} outputs{handoff})"
