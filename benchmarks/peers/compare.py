"""One table from the output folders of `benchmarks.peers.verl_gpu`: every side found, per phase, and the ratios
of the pairs that do the same work.

    python -m benchmarks.peers.compare DIR [DIR ...] [--out table.json]

Each DIR is one call's $OUT (the sides may come from two calls made back to back); a side's file is named as in
`gpu_sides.SIDE_FILES` (verl: its `file` logger's JSONL; ours: benchmarks.e2e_step's JSON; TRL: trl_gpu's
JSON, or its {"error": ...} when TRL could not run), and runs.json adds each run's wall time and NVML peak.
Steady state = steps 2..N (step 1 holds CUDA-graph capture, torch.compile and allocator warm-up); each row
is the mean over those steps. Step time: verl's `timing_s/step` (rollout through weight update, without its
metric collection and logging); ours `timing/wall_step_s` (the whole loop iteration, logging included);
TRL's time between the ends of consecutive optimizer steps (its logging included). Tokens/s = (prompt +
response tokens of the step) / step time. Phase boundaries that differ are listed in the README.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.peers.gpu_settings import PAIRS, SIDES
from benchmarks.peers.gpu_sides import SIDE_FILES

# (row, verl key, key of ours and TRL: trl_gpu writes our e2e history's keys)
ROWS = (
    ("step_s", "timing_s/step", "timing/wall_step_s"),
    ("generate_s", "timing_s/gen", "timing/generate_s"),
    ("weight_sync_s", "timing_s/update_weights", "timing/sync_weights_s"),
    ("reward_s", "timing_s/reward", "timing/reward_s"),
    ("old_log_prob_s", "timing_s/old_log_prob", "timing/old_log_prob_s"),
    ("ref_log_prob_s", "timing_s/ref", "timing/ref_log_prob_s"),
    ("advantage_s", "timing_s/adv", "timing/advantage_s"),
    ("update_actor_s", "timing_s/update_actor", "timing/update_actor_s"),
    ("response_length_mean", "response_length/mean", "response/length_mean"),
    ("tokens_per_step", "perf/total_num_tokens", "perf/tokens"),
    ("reward_mean", "critic/score/mean", "reward/mean"),
)


def load_history(side: str, path: Path) -> list[dict[str, float]]:
    """The side's per-step records; raises ValueError with the side's own error (TRL) or when it has none."""
    if side == "verl":
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [dict(r["data"], step=r["step"]) for r in records if "timing_s/step" in r["data"]]
    data = json.loads(path.read_text())
    if "error" in data:
        raise ValueError(data["error"])
    return data["history"] if side == "trl" else data["results"][0]["history"]


def steady(history: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in history[1:] if isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else None


def side_rows(side: str, history: list[dict[str, float]]) -> dict[str, float | None]:
    column = 1 if side == "verl" else 2
    rows = {row[0]: steady(history, row[column]) for row in ROWS}
    step_key = ROWS[0][column]
    rows["step_median_s"] = statistics.median(r[step_key] for r in history[1:])
    tokens, step = rows["tokens_per_step"], rows["step_s"]
    rows["tokens_per_s"] = tokens / step if tokens and step else None
    if side == "verl":
        rows["allocator_peak_gib"] = max((r["perf/max_memory_allocated_gb"] for r in history if "perf/max_memory_allocated_gb" in r), default=None)
    else:
        peaks = [v for r in history for k, v in r.items() if k.endswith("peak_allocated_gib")]
        rows["allocator_peak_gib"] = max(peaks) if peaks else None
    return rows


def compare_folders(folders: list[Path]) -> dict[str, Any]:
    """Every side found in `folders` (a later folder's file of the same side wins) -> the table."""
    files: dict[str, Path] = {}
    runs: dict[str, dict[str, Any]] = {}
    for folder in folders:
        files.update({side: folder / name for side, name in SIDE_FILES.items() if (folder / name).exists()})
        if (folder / "runs.json").exists():
            runs.update(json.loads((folder / "runs.json").read_text()))
    columns: dict[str, dict[str, float | None]] = {}
    steps: dict[str, int] = {}
    errors: dict[str, str] = {side: f"not run ({run.get('reason', 'skipped')})" for side, run in runs.items() if run.get("exit") == "skipped"}
    for side in SIDES:
        if side not in files:
            continue
        try:
            history = load_history(side, files[side])
            if len(history) < 2:
                raise ValueError(f"{len(history)} step(s) recorded; the steady state needs at least 2")
        except (ValueError, KeyError, IndexError, json.JSONDecodeError) as error:
            errors[side] = f"{files[side].name}: {error}"
            continue
        steps[side] = len(history)
        columns[side] = side_rows(side, history)
        columns[side]["gpu_used_peak_gib"] = runs.get(side, {}).get("gpu_used_peak_gib")
        columns[side]["run_wall_s"] = runs.get(side, {}).get("wall_s")
    for side, run in runs.items():
        if run.get("exit") in (0, "skipped"):
            continue
        ended = f"exit {run.get('exit')} after {run.get('wall_s', 0):.0f} s"
        if side in columns:
            errors[side] = f"{ended}; the table uses the {steps[side]} steps recorded before"
        elif side not in errors:
            errors[side] = f"{ended}, no steps recorded (see {side}_log.txt)"
        else:
            errors[side] = f"{ended}; {errors[side]}"
    names = list(next(iter(columns.values()))) if columns else []
    rows = {name: {side: columns[side][name] for side in columns} for name in names}
    ratios = {f"{ours}/{peer}": _ratios(columns[ours], columns[peer]) for ours, peer in PAIRS if ours in columns and peer in columns}
    return {"steps": steps, "rows": rows, "ratios": ratios, "errors": errors}


def _ratios(ours: dict[str, float | None], peer: dict[str, float | None]) -> dict[str, float | None]:
    return {name: ours[name] / peer[name] if ours[name] is not None and peer.get(name) else None for name in ours}


def print_table(table: dict[str, Any]) -> None:
    sides, pairs = list(table["steps"]), list(table["ratios"])
    cell = lambda v, w: f"{v:{w}.3f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"
    print("\nsteady state (mean of steps 2..N); steps per side: " + ", ".join(f"{s} {n}" for s, n in table["steps"].items()))
    print(f"{'measure':<22}" + "".join(f"{s:>13}" for s in sides) + "".join(f"{p:>20}" for p in pairs))
    for name, values in table["rows"].items():
        print(f"{name:<22}" + "".join(cell(values[s], 13) for s in sides) + "".join(cell(table["ratios"][p][name], 20) for p in pairs))
    for side, error in table["errors"].items():
        print(f"{side}: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    table = compare_folders(args.folders)
    print_table(table)
    if args.out:
        args.out.write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
