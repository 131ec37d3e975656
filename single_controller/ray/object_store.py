"""Put many objects into the Ray object store at once (serialisation of large batches overlaps in threads)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import ray

from single_controller.errors import DispatchError

MAX_PUT_THREADS = 16


def parallel_put(data_list: Sequence[Any], max_workers: int | None = None) -> list[ray.ObjectRef]:
    """`[ray.put(x) for x in data_list]`, run on up to `max_workers` threads; refs in the input order."""
    if len(data_list) == 0:
        raise DispatchError("parallel_put needs at least one object to put")
    workers = max_workers if max_workers is not None else min(len(data_list), MAX_PUT_THREADS)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DispatchError(f"max_workers must be a positive int, got {max_workers!r}")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(ray.put, data_list))
