"""The engine-API examples on a GPU, with the path each weight sync took and its verification.

    python -m benchmarks.engine_examples [--workdir /tmp/engine_examples] [--out results/engine_examples.json]
        [--repeats N] [--only quickstart lora vlm] [--vary-lora-seed]

Runs `examples.engine_quickstart` and `examples.engine_lora` on a random-init Qwen2 of the 0.5B shape
(train engine colocated with the vLLM engine: CUDA IPC), the quick start again with the train engine on its
own GPU when there are two (NCCL broadcast), and `examples.engine_vlm` on its tiny vision-language model.
Each sync is verified against the trainer's log-probs of a probe batch.

`--repeats N` runs the examples N times in a row on the models built once. Every row names its repeat and,
for a synced example, the verified gap (`gap_max` / `gap_mean`: the probe log-prob difference the check
measured); a sync that fails its check is a row with `passed: false` and the error. The last line is the
summary: per example, runs passed out of N and the gaps of every run. The LoRA example uses seed 0 each
time (so its losses should repeat) or, with `--vary-lora-seed`, the repeat's number as its seed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.gpu_grpo_step import build_model
from examples import engine_lora, engine_quickstart, engine_vlm
from workers.rollout.verify import WeightSyncMismatch

EXAMPLES = ("quickstart", "lora", "vlm")


def _timed(name: str, repeat: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    start = time.perf_counter()
    row: dict[str, Any] = {"example": name, "repeat": repeat}
    try:
        result = run()
    except WeightSyncMismatch as error:  # the check failed: a result, not a crash (the example cleaned up)
        row.update({"passed": False, "wall_s": round(time.perf_counter() - start, 2), "error": str(error)})
        print(json.dumps(row), flush=True)
        return row
    row.update({"passed": True, "wall_s": round(time.perf_counter() - start, 2),
                "losses": [round(x, 4) for x in result["losses"]]})
    train = result["train"]
    if "infer" in result:
        sync = result["sync"]
        row.update({"sync_path": train.sync_path, "gap_max": sync["rollout/sync_logprob_max_diff"],
                    "gap_mean": sync["rollout/sync_logprob_mean_diff"], **sync,
                    "greedy_changed": result["after"] != result["before"]})
        result["infer"].shutdown()
    train.shutdown()
    print(json.dumps(row), flush=True)
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per example: runs passed out of runs, and each run's verified gap (None where there is no sync)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = out.setdefault(row["example"], {"passed": 0, "runs": 0, "gap_max": [], "gap_mean": [], "loss_last": []})
        entry["runs"] += 1
        entry["passed"] += int(row["passed"])
        entry["gap_max"].append(row.get("gap_max"))
        entry["gap_mean"].append(row.get("gap_mean"))
        entry["loss_last"].append(row["losses"][-1] if row["passed"] else None)
    for entry in out.values():
        entry["passes"] = f"{entry['passed']}/{entry['runs']}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/engine_examples")
    parser.add_argument("--out", default="results/engine_examples.json")
    parser.add_argument("--repeats", type=int, default=1, help="run the examples this many times in a row")
    parser.add_argument("--only", nargs="+", choices=EXAMPLES, default=list(EXAMPLES), help="which examples to run")
    parser.add_argument("--vary-lora-seed", action="store_true", help="the LoRA example's seed is the repeat's number")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    from single_controller.ray.local_cluster import init_local_ray, prepend_pythonpath

    work = Path(args.workdir)
    model = work / "model_0.5B"
    if not model.is_dir():
        build_model(model)
    vlm = work / "tiny_vlm"
    if "vlm" in args.only and not vlm.is_dir():
        engine_vlm.build_tiny_vlm(vlm)
    gpus = torch.cuda.device_count()
    init_local_ray(num_cpus=8, num_gpus=gpus, runtime_env={"env_vars": {"PYTHONPATH": prepend_pythonpath(os.getcwd())}})
    rows = []
    for repeat in range(args.repeats):
        lora_seed = repeat if args.vary_lora_seed else 0
        if "quickstart" in args.only:
            rows.append(_timed("quickstart (colocated)", repeat, lambda: engine_quickstart.run(str(model))))
        if "lora" in args.only:
            rows.append(_timed("lora (colocated)", repeat, lambda: engine_lora.run(str(model), seed=lora_seed)))
        if "quickstart" in args.only and gpus >= 2:
            rows.append(_timed("quickstart (own GPU)", repeat, lambda: engine_quickstart.run(str(model), colocate=False)))
        if "vlm" in args.only:
            rows.append(_timed("vlm", repeat, lambda: engine_vlm.run(str(vlm))))
    totals = summary(rows)
    print(json.dumps({"summary": totals}), flush=True)
    result = {"device": torch.cuda.get_device_name(0) if gpus else "cpu", "gpus": gpus, "repeats": args.repeats,
              "rows": rows, "summary": totals}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
