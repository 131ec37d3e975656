"""One table from verl's per-step metrics (its `file` logger's JSONL) and our `benchmarks.e2e_step` JSON.

    python -m benchmarks.peers.compare VERL_METRICS.jsonl OURS_E2E.json [--runs runs.json] [--out table.json]

Steady state on both sides = steps 2..N (step 1 holds CUDA-graph capture, torch.compile and allocator
warm-up); each row gives the mean over those steps and ours/verl. Step time is verl's `timing_s/step`
(rollout through weight update, without its metric collection and logging) against our
`timing/wall_step_s` (the whole loop iteration, logging included), so any difference in what the timers
cover counts against ours. Tokens/s = (prompt + response tokens of the step) / step time on both sides.
`runs.json` (from benchmarks.peers.verl_gpu) adds each run's wall time and the NVML peak of device memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

# (row, verl key, our key); phases whose boundaries differ are noted in benchmarks/peers/README.md.
ROWS = (
    ("step_s", "timing_s/step", "timing/wall_step_s"),
    ("generate_s", "timing_s/gen", "timing/generate_s"),
    ("weight_sync_s", "timing_s/update_weights", "timing/sync_weights_s"),
    ("reward_s", "timing_s/reward", "timing/reward_s"),
    ("old_log_prob_s", "timing_s/old_log_prob", "timing/old_log_prob_s"),
    ("ref_log_prob_s", "timing_s/ref", "timing/ref_log_prob_s"),
    ("advantage_s", "timing_s/adv", "timing/advantage_s"),
    ("update_actor_s", "timing_s/update_actor", "timing/update_actor_s"),
    ("tokens_per_step", "perf/total_num_tokens", "perf/tokens"),
    ("response_length_mean", "response_length/mean", "response/length_mean"),
    ("reward_mean", "critic/score/mean", "reward/mean"),
    ("allocator_peak_gib", "perf/max_memory_allocated_gb", None),
)


def load_verl(path: Path) -> list[dict[str, float]]:
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [dict(record["data"], step=record["step"]) for record in steps if "timing_s/step" in record["data"]]


def load_ours(path: Path) -> list[dict[str, float]]:
    return json.loads(path.read_text())["results"][0]["history"]


def steady(history: list[dict[str, float]], key: str | None) -> float | None:
    values = [r[key] for r in history[1:] if key and isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def compare(verl_file: Path, ours_file: Path, runs_file: Path | None = None) -> dict[str, Any]:
    verl, ours = load_verl(verl_file), load_ours(ours_file)
    if len(verl) < 2 or len(ours) < 2:
        raise ValueError(f"need at least 2 steps per side for a steady state; verl has {len(verl)}, ours {len(ours)}")
    rows: dict[str, dict[str, float | None]] = {}
    for name, verl_key, our_key in ROWS:
        rows[name] = {"verl": steady(verl, verl_key), "ours": steady(ours, our_key)}
    peaks = [v for r in ours for k, v in r.items() if k.endswith("peak_allocated_gib")]
    rows["allocator_peak_gib"]["ours"] = max(peaks) if peaks else None
    rows["step_median_s"] = {"verl": statistics.median(r["timing_s/step"] for r in verl[1:]),
                             "ours": statistics.median(r["timing/wall_step_s"] for r in ours[1:])}
    rows["our_phase_sum_s"] = {"verl": None, "ours": steady(ours, "timing/step_s")}
    for side in ("verl", "ours"):
        tokens, step = rows["tokens_per_step"][side], rows["step_s"][side]
        rows.setdefault("tokens_per_s", {})[side] = tokens / step if tokens and step else None
    if runs_file and runs_file.exists():
        runs = json.loads(runs_file.read_text())
        rows["gpu_used_peak_gib"] = {side: runs.get(side, {}).get("gpu_used_peak_gib") for side in ("verl", "ours")}
        rows["run_wall_s"] = {side: runs.get(side, {}).get("wall_s") for side in ("verl", "ours")}
    for values in rows.values():
        values["ours/verl"] = values["ours"] / values["verl"] if values["ours"] is not None and values["verl"] else None
    return {"steps": {"verl": len(verl), "ours": len(ours)}, "rows": rows}


def print_table(table: dict[str, Any]) -> None:
    print(f"\nsteady state (mean of steps 2..N; verl {table['steps']['verl']} steps, ours {table['steps']['ours']})")
    print(f"{'measure':<24}{'verl':>12}{'ours':>12}{'ours/verl':>11}")
    cell = lambda v: f"{v:12.3f}" if isinstance(v, (int, float)) else f"{'-':>12}"
    for name, values in table["rows"].items():
        print(f"{name:<24}{cell(values['verl'])}{cell(values['ours'])}{cell(values['ours/verl'])[1:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("verl_metrics", type=Path)
    parser.add_argument("ours_e2e", type=Path)
    parser.add_argument("--runs", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    table = compare(args.verl_metrics, args.ours_e2e, args.runs)
    print_table(table)
    if args.out:
        args.out.write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
