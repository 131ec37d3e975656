"""How long a worker group of the FSDP actor takes to start, against the staged start measured in the same run.

    python -m benchmarks.group_start [--world-sizes 1,2] [--repeats 3] [--out results/group_start.json]

Staged (the baseline, raw Ray): rank 0's actor is created and waited for, then the other ranks (the order a
worker group needs when the other ranks get rank 0's master port at creation). Ours: `RayWorkerGroup(...)`,
every rank requested at once (rank 0 publishes its port, the others read it before their `__init__`). Both
time the same thing: until every rank has finished `__init__`, which is mostly the worker process importing
torch and transformers. A fresh pool per measurement; nothing else runs on the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from single_controller.ray.local_cluster import init_local_ray  # noqa: E402
from trainer.config_loader import load_config  # noqa: E402
from trainer.role_groups import actor_worker_config  # noqa: E402
from workers.fsdp import ActorRolloutRefWorker  # noqa: E402


def _staged_start(pool: RayResourcePool, config: dict[str, Any]) -> float:
    """Raw Ray: rank 0 first, waited for, then the rest."""
    remote_cls = ray.remote(ActorRolloutRefWorker)
    started = time.perf_counter()
    actors = []
    for rank, slot in enumerate(pool.rank_slots()):
        env = {"RANK": str(rank), "WORLD_SIZE": str(pool.world_size)}
        options = {
            **pool.actor_resources(),
            "runtime_env": {"env_vars": env},
            "scheduling_strategy": PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index),
        }
        actors.append(remote_cls.options(**options).remote(config, "actor_rollout"))
        ray.get(actors[-1].sc_world_size.remote())  # this rank's __init__ is done
    elapsed = time.perf_counter() - started
    for actor in actors:
        ray.kill(actor)
    return elapsed


def _group_start(pool: RayResourcePool, config: dict[str, Any]) -> float:
    started = time.perf_counter()
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config, "actor_rollout"))
    elapsed = time.perf_counter() - started
    group.kill()
    return elapsed


def measure(world_size: int, repeats: int, config: dict[str, Any]) -> dict[str, Any]:
    times: dict[str, list[float]] = {"staged": [], "ours": []}
    for _ in range(repeats):
        for name, start in (("staged", _staged_start), ("ours", _group_start)):  # alternate: drift hits both
            pool = RayResourcePool([world_size], use_gpu=False)
            try:
                times[name].append(start(pool, config))
            finally:
                pool.release()
            time.sleep(1.0)  # let the killed processes exit before the next start
    staged, ours = statistics.median(times["staged"]), statistics.median(times["ours"])
    return {"world_size": world_size, "staged_s": staged, "ours_s": ours, "ours_over_staged": ours / staged, "runs": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/group_start.json")
    args = parser.parse_args()

    init_local_ray(num_cpus=max(8, os.cpu_count() or 1))
    config = actor_worker_config(load_config([]))
    rows = [measure(int(size), args.repeats, config) for size in args.world_sizes.split(",")]
    print(f"{'ranks':>5} | {'staged (s)':>10} | {'ours (s)':>8} | ours / staged")
    for row in rows:
        print(f"{row['world_size']:>5} | {row['staged_s']:>10.2f} | {row['ours_s']:>8.2f} | {row['ours_over_staged']:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    out.write_text(json.dumps({"machine": machine, "repeats": args.repeats, "rows": rows}, indent=2))
    print(f"wrote {out}")
    ray.shutdown()


if __name__ == "__main__":
    main()
