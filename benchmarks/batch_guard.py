"""Cost of the guarded batch class (protocol/batch_guard.py) on everyday DataProto operations.

    python -m benchmarks.batch_guard [--out results/batch_guard.json] [--repeats 200]

`DataProto.batch` is a `GuardedBatch` (a TensorDict subclass that rejects a DataProto stored under a key).
TensorDict keeps some fast paths for its exact class, so this compares each operation with the guard
against the same operation with the guard switched off (plain TensorDict batches), in the same run,
alternating the two so machine noise hits both alike. Baseline = plain TensorDict; target: within 10%.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import protocol.data_proto as data_proto_module
from protocol import DataProto
from protocol.batch_guard import guard_batch


def sample(rows: int = 256, keys: int = 8) -> DataProto:
    tensors = {f"k{i}": torch.randn(rows, 128) for i in range(keys)}
    return DataProto.from_dict(tensors, {"uid": [str(i) for i in range(rows)]}, meta_info={"step": 1})


OPERATIONS: dict[str, Callable[[DataProto], Any]] = {
    "slice": lambda d: d[0:64],
    "index list": lambda d: d[list(range(0, len(d), 2))],
    "chunk(4)": lambda d: d.chunk(4),
    "concat(4 chunks)": lambda d: DataProto.concat(d.chunk(4)),
    "select(2 keys)": lambda d: d.select(batch_keys=["k0", "k1"]),
    "union": lambda d: d.select(batch_keys=["k0"]).union(d.select(batch_keys=["k1"])),
    "pickle round trip": lambda d: pickle.loads(pickle.dumps(d, protocol=5)),
    "assign a tensor": lambda d: d.batch.set("extra", torch.zeros(len(d))),
}


def time_op(op: Callable[[DataProto], Any], data: DataProto, repeats: int) -> float:
    op(data)
    started = time.perf_counter()
    for _ in range(repeats):
        op(data)
    return (time.perf_counter() - started) / repeats


def run(repeats: int, rounds: int = 5) -> list[dict[str, Any]]:
    results = []
    for name, op in OPERATIONS.items():
        guarded_times, plain_times = [], []
        for _ in range(rounds):
            data_proto_module.guard_batch = guard_batch
            guarded_times.append(time_op(op, sample(), repeats))
            data_proto_module.guard_batch = lambda batch: batch  # plain TensorDict batches
            plain_times.append(time_op(op, sample(), repeats))
        data_proto_module.guard_batch = guard_batch
        guarded, plain = statistics.median(guarded_times), statistics.median(plain_times)
        results.append({"operation": name, "guarded_us": guarded * 1e6, "plain_us": plain * 1e6, "ratio": guarded / plain})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = run(args.repeats)
    print(f"{'operation':<20} {'guarded (us)':>13} {'plain (us)':>11} {'ratio':>6}")
    for row in results:
        print(f"{row['operation']:<20} {row['guarded_us']:>13.1f} {row['plain_us']:>11.1f} {row['ratio']:>6.2f}")
    ratios = [row["ratio"] for row in results]
    print(f"geometric mean ratio {float(np.exp(np.mean(np.log(ratios)))):.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"repeats": args.repeats, "results": results}, indent=2))


if __name__ == "__main__":
    main()
