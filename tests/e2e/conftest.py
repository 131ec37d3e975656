"""Helpers of the end-to-end tests: the overrides of a tiny run and what a resumed run must reproduce (the assets
they run on are tests/conftest.py's session fixtures)."""

# One trainer process where a test's checks do not need two: on CPU a second rank doubles a tiny run's cost (measured
# on the 2-core CI machine, Ray up: one step 9.5 CPU-s on one rank against 17-21 on two, each further step 1.1 against
# 2.0), and the suite is CPU-bound. Sharding, the data-parallel reduction and sharded checkpoints keep their two-rank
# tests (test_training_runs.py's resume, the hybrid-engine, Megatron parallel and multi-node tests).
ONE_RANK = "trainer.n_gpus_per_node=1"


def run_overrides(assets: dict, out_dir, *extra: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={assets['model']}",
        f"data.train_files={assets['train']}",
        f"data.val_files={assets['val']}",
        f"trainer.default_local_dir={out_dir}",
        "trainer.logger=[jsonl]",
        *extra,
    ]


# What the workers report once, at the first step after they start (how they were built): a resumed run's new
# workers report it again.
START_REPORTS = ("actor/fsdp_shard_ranks", "rollout/engine_shards_in_trainers", "rollout/kv_cache_sequences")


def comparable_metrics(history: list[dict]) -> list[dict]:
    """A run's step records without what differs run to run (timing, throughput, memory and its offload moves, the
    workers' start reports): everything computed from the data must match between a straight and a resumed run."""
    volatile = ("timing/", "perf/", "memory/", "offload/", "overhead/", "rollout/sync_s", "rollout/generate_s",
                "rollout/engine_memory/")
    return [{k: v for k, v in r.items() if not k.startswith(volatile) and k not in START_REPORTS} for r in history]
