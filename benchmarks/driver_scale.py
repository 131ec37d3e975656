"""The driver at scale: a no-op registered call and the dispatch + collect of a 7B GRPO step's batch over 16, 64
and 256 CPU workers, on one Ray node and on several simulated nodes, each beside a raw Ray fan-out on the same
actors.

    python -m benchmarks.driver_scale [--workers 16,64,256] [--nodes 1,4] [--repeats 20]
        [--out results/driver_scale.json]

The batch is a GRPO step of the `7b-2gpu` comparison: 32 prompts x 8 responses of 512 + 1024 tokens (token ids,
masks, positions, responses, advantages, reference log-probs; ~17 MiB); each worker returns float32 log-probs of
its rows' responses, as an old-log-prob pass does. Simulated nodes are separate raylets on this machine
(`ray.cluster_utils.Cluster`, as `ray start` on each node makes them), the workers spread evenly over them. Per
row: the group's start, the no-op call and the raw fan-out (medians), the step's dispatch + collect (median) and
the driver's time per worker. Growth faster than linear in the workers shows as a rising time per worker.
Written for a machine with many cores (a 64-core GPU host); `--workers 4 --nodes 1,2 --repeats 3` checks the
script on a laptop.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from benchmarks.dispatch import BenchWorker, _median_time  # noqa: E402
from protocol import DataProto  # noqa: E402
from single_controller import Dispatch, register  # noqa: E402
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402

PROMPTS, RESPONSES_PER_PROMPT, PROMPT_TOKENS, RESPONSE_TOKENS = 32, 8, 512, 1024


class LogProbWorker(BenchWorker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def log_probs(self, data: DataProto) -> DataProto:
        responses = data.batch["responses"]
        return DataProto.from_dict({"old_log_probs": torch.zeros(responses.shape, dtype=torch.float32)})


def grpo_batch() -> DataProto:
    rows, width = PROMPTS * RESPONSES_PER_PROMPT, PROMPT_TOKENS + RESPONSE_TOKENS
    ids = torch.randint(0, 152_000, (rows, width))
    response_shape = (rows, RESPONSE_TOKENS)
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(width).expand(rows, -1),
        "responses": ids[:, PROMPT_TOKENS:], "response_mask": torch.ones(response_shape, dtype=torch.long),
        "advantages": torch.randn(response_shape), "ref_log_prob": torch.randn(response_shape),
    })


def measure(workers: int, nodes: int, data: DataProto, repeats: int) -> dict[str, Any]:
    per_node = workers // nodes
    cpus = max(1, os.cpu_count() or 1)
    pool = RayResourcePool([per_node] * nodes, use_gpu=False, max_colocate_count=1,
                           cpus_per_process=min(1.0, cpus / workers))
    started = time.perf_counter()
    group = RayWorkerGroup(pool, RayClassWithInitArgs(LogProbWorker))
    group.noop()
    start_s = time.perf_counter() - started
    actors = group.workers
    noop = _median_time(group.noop, repeats)
    raw = _median_time(lambda: ray.get([actor.noop.remote() for actor in actors]), repeats)
    step = _median_time(lambda: group.log_probs(data), repeats, warmup=2)
    group.kill()
    pool.release()
    return {
        "workers": workers, "nodes": nodes, "group_start_s": start_s, "noop_ms": noop * 1e3,
        "raw_ray_ms": raw * 1e3, "noop_vs_raw": noop / raw, "step_ms": step * 1e3,
        "step_ms_per_worker": step * 1e3 / workers,
    }


def start_cluster(nodes: int, cpus: int) -> Cluster:
    """A head and `nodes - 1` more raylets on this machine, the CPUs shared evenly; the driver attaches."""
    per_node = max(1, cpus // nodes)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": per_node, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=per_node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    return cluster


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| workers | nodes | group start (s) | no-op call (ms) | raw Ray (ms) | ratio | step dispatch + collect (ms) "
          "| per worker (ms) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['workers']} | {r['nodes']} | {r['group_start_s']:.1f} | {r['noop_ms']:.2f} | "
              f"{r['raw_ray_ms']:.2f} | {r['noop_vs_raw']:.2f} | {r['step_ms']:.1f} | {r['step_ms_per_worker']:.3f} |")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="16,64,256")
    parser.add_argument("--nodes", default="1,4")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="results/driver_scale.json")
    args = parser.parse_args(argv)
    worker_counts = [int(w) for w in args.workers.split(",")]
    node_counts = [int(n) for n in args.nodes.split(",")]
    uneven = [(w, n) for w in worker_counts for n in node_counts if w % n]
    if uneven:
        parser.error(f"workers must split evenly over the nodes; these do not: {uneven}")
    cpus = os.cpu_count() or 1
    data = grpo_batch()
    rows = []
    for nodes in node_counts:
        cluster = start_cluster(nodes, cpus)
        try:
            rows.extend(measure(workers, nodes, data, args.repeats) for workers in worker_counts)
        finally:
            ray.shutdown()
            cluster.shutdown()
    print_table(rows)
    report = {
        "machine": {"cpus": cpus, "platform": platform.platform(), "torch": torch.__version__, "ray": ray.__version__},
        "batch_mib": sum(t.numel() * t.element_size() for t in data.batch.values()) / 2**20,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return rows


if __name__ == "__main__":
    main()
