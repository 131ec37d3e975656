"""Dispatch overhead and data bandwidth of worker groups, each against a baseline measured in the same run.

    python -m benchmarks.dispatch [--out results/dispatch.json] [--quick]

P1: a no-op registered method over 2/4/8 workers vs a raw Ray fan-out on the same actors
    (`ray.get([a.noop.remote() for a in actors])`). Target: <= 1.3x raw Ray.
P2: dispatch + collect of a DataProto of 16/64/256 MiB over 2 workers vs one memcpy of the same bytes.
    Target: >= 50% of memcpy bandwidth. Two methods: `consume` returns one number per sample (dispatch
    dominates, the usual case: log-probs back from a batch of token ids), `echo` returns the whole chunk
    (a full round trip of the bytes, which needs at least three copies).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402

from protocol import DataProto  # noqa: E402
from single_controller import Dispatch, Worker, register  # noqa: E402
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from single_controller.ray.local_cluster import init_local_ray  # noqa: E402

MIB = 1 << 20


class BenchWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(Dispatch.DP_COMPUTE_PROTO)
    def consume(self, data: DataProto) -> DataProto:
        x = data.batch["x"]
        return DataProto.from_dict({"first": x[:, 0].clone()})

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


def _median_time(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_noop(world_sizes: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in world_sizes:
        pool = RayResourcePool(process_on_nodes=[n], use_gpu=False, max_colocate_count=1, cpus_per_process=0.1)
        group = RayWorkerGroup(pool, RayClassWithInitArgs(BenchWorker))
        actors = group.workers
        ours = _median_time(group.noop, repeats)
        raw = _median_time(lambda: ray.get([a.noop.remote() for a in actors]), repeats)
        rows.append({"workers": n, "group_ms": ours * 1e3, "raw_ray_ms": raw * 1e3, "ratio": ours / raw})
        group.kill()
        pool.release()
    return rows


def bench_bandwidth(sizes_mib: list[int], repeats: int) -> list[dict]:
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1, cpus_per_process=0.1)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(BenchWorker))
    rows = []
    for size in sizes_mib:
        rows_n = 4096
        x = torch.randn(rows_n, size * MIB // (4 * rows_n))
        data = DataProto.from_dict({"x": x})
        target = torch.empty_like(x)
        # Two baselines: a copy into memory already touched (warm), and into a new allocation, which
        # pays the page faults any copy to a new place pays.
        memcpy = _median_time(lambda: target.copy_(x), repeats)
        memcpy_fresh = _median_time(lambda: torch.empty_like(x).copy_(x), repeats)
        for method in ("consume", "echo"):
            elapsed = _median_time(lambda: getattr(group, method)(data), repeats, warmup=1)
            rows.append(
                {
                    "size_mib": size,
                    "method": method,
                    "seconds": elapsed,
                    "gib_per_s": size / 1024 / elapsed,
                    "memcpy_gib_per_s": size / 1024 / memcpy,
                    "share_of_memcpy": memcpy / elapsed,
                    "fresh_memcpy_gib_per_s": size / 1024 / memcpy_fresh,
                    "share_of_fresh_memcpy": memcpy_fresh / elapsed,
                }
            )
        del data, x, target
    group.kill()
    pool.release()
    return rows


def _print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    keys = list(rows[0])
    print("  ".join(f"{k:>16}" for k in keys))
    for row in rows:
        print("  ".join(f"{v:>16.3f}" if isinstance(v, float) else f"{v!s:>16}" for v in row.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/dispatch.json")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sizes (a smoke run)")
    args = parser.parse_args()
    init_local_ray(num_cpus=max(4, os.cpu_count() or 1), object_store_memory=3 << 30)
    repeats = 20 if args.quick else 200
    noop = bench_noop([2, 4, 8], repeats)
    bandwidth = bench_bandwidth([16] if args.quick else [16, 64, 256], 3 if args.quick else 7)
    _print_table("P1: no-op call latency (median)", noop)
    _print_table("P2: DataProto dispatch + collect over 2 workers vs memcpy", bandwidth)
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__, "ray": ray.__version__},
        "p1_noop": noop,
        "p2_bandwidth": bandwidth,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    ray.shutdown()


if __name__ == "__main__":
    main()
