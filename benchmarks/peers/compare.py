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
response tokens of the step) / step time; per GPU: / the GPUs of setup.json. Phase boundaries that differ are
listed in the README.

MFU, with setup.json (the model's config, GPUs, the device's bf16 peak; written by verl_gpu): `mfu_<phase>` is
every side's phase by one count, trainer/flops.py's (the toolkit's `perf/mfu/<phase>` count) over the side's own
phase time, GPUs and peak. It takes each side's tokens per step and mean response length, with every sequence
at the mean length (EOS is ignored, so only prompt lengths vary: a few tokens of ~1,100). `reported_mfu_*` are
what each side logs itself: verl's `perf/mfu/actor` (update) and `perf/mfu/actor_infer` (old log-probs), timed
inside its worker and counting the embedding as a matmul (6 x vocabulary x hidden more per token than ours);
ours `perf/mfu/update_actor` and `perf/mfu/old_log_prob`, timed by the driver.

Memory: `gpu_used_peak_gib` is the device's peak (NVML, runs.json), the measured one. `allocator_lifetime_peak_gib`
is the trainer process's PyTorch allocator peak over the run (`torch.cuda.max_memory_allocated`: verl's
`perf/max_memory_allocated_gb`, read in its update; TRL's, read after training; ours the highest of the worker's
per-phase peaks, the same figure). PyTorch counts every pool of the process, an in-process vLLM engine's weights
and KV cache too, also while the engine sleeps with them unmapped: it is not the device's use and can exceed the GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.peers.gpu_settings import PAIRS, SIDES
from benchmarks.peers.gpu_sides import SIDE_FILES
from trainer.flops import Flops, ModelFlops
from trainer.memory_plan.shape import ModelShape

SETUP_FILE = "setup.json"
TERA = 1e12
MFU_PHASES = ("generate", "old_log_prob", "ref_log_prob", "update_actor")
# (row, verl's own key, ours and TRL's key)
REPORTED_MFU = (
    ("reported_mfu_old_log_prob", "perf/mfu/actor_infer", "perf/mfu/old_log_prob"),
    ("reported_mfu_update_actor", "perf/mfu/actor", "perf/mfu/update_actor"),
)

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


def phase_flops(setup: dict[str, Any], tokens_per_step: float, response_length: float) -> dict[str, Flops]:
    """Each MFU phase's model FLOPs for one step of `tokens_per_step` tokens in the setup's responses per step,
    every sequence at the mean length (trainer/flops.py's count)."""
    flops = ModelFlops(ModelShape.from_config(setup["model_config"]))
    settings = setup["settings"]
    sequences = settings["prompts_per_step"] * settings["generations"]
    lengths = [tokens_per_step / sequences] * sequences
    return {"generate": flops.generate(lengths, [response_length] * sequences), "old_log_prob": flops.forward(lengths),
            "ref_log_prob": flops.forward(lengths), "update_actor": flops.train(lengths)}


def counted_mfu(rows: dict[str, float | None], setup: dict[str, Any] | None) -> dict[str, float | None]:
    """`mfu_<phase>` of one side's steady rows by one count (None where a figure is missing)."""
    out: dict[str, float | None] = {f"mfu_{phase}": None for phase in MFU_PHASES}
    tokens, response = rows.get("tokens_per_step"), rows.get("response_length_mean")
    if not setup or not setup.get("peak_tflops") or not tokens or not response:
        return out
    capacity = setup["gpus"] * setup["peak_tflops"] * TERA
    for phase, work in phase_flops(setup, tokens, response).items():
        seconds = rows.get(f"{phase}_s")
        out[f"mfu_{phase}"] = work.total / (seconds * capacity) if seconds else None
    return out


def side_rows(side: str, history: list[dict[str, float]], setup: dict[str, Any] | None = None) -> dict[str, float | None]:
    column = 1 if side == "verl" else 2
    rows = {row[0]: steady(history, row[column]) for row in ROWS}
    step_key = ROWS[0][column]
    rows["step_median_s"] = statistics.median(r[step_key] for r in history[1:])
    tokens, step = rows["tokens_per_step"], rows["step_s"]
    rows["tokens_per_s"] = tokens / step if tokens and step else None
    gpus = setup.get("gpus") if setup else None
    rows["tokens_per_s_per_gpu"] = rows["tokens_per_s"] / gpus if rows["tokens_per_s"] and gpus else None
    rows.update(counted_mfu(rows, setup))
    rows.update({row: steady(history, key[column - 1]) for row, *key in REPORTED_MFU})
    if side == "verl":
        rows["allocator_lifetime_peak_gib"] = max((r["perf/max_memory_allocated_gb"] for r in history if "perf/max_memory_allocated_gb" in r), default=None)
    else:
        peaks = [v for r in history for k, v in r.items() if k.endswith("peak_allocated_gib")]
        rows["allocator_lifetime_peak_gib"] = max(peaks) if peaks else None
    return rows


def compare_folders(folders: list[Path]) -> dict[str, Any]:
    """Every side found in `folders` (a later folder's file of the same side wins) -> the table."""
    files: dict[str, Path] = {}
    runs: dict[str, dict[str, Any]] = {}
    setup: dict[str, Any] | None = None
    for folder in folders:
        files.update({side: folder / name for side, name in SIDE_FILES.items() if (folder / name).exists()})
        if (folder / "runs.json").exists():
            runs.update(json.loads((folder / "runs.json").read_text()))
        if (folder / SETUP_FILE).exists():
            setup = json.loads((folder / SETUP_FILE).read_text())
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
        columns[side] = side_rows(side, history, setup)
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
    names = _next_to_times(list(next(iter(columns.values())))) if columns else []
    rows = {name: {side: columns[side][name] for side in columns} for name in names}
    ratios = {f"{ours}/{peer}": _ratios(columns[ours], columns[peer]) for ours, peer in PAIRS if ours in columns and peer in columns}
    device = {key: setup.get(key) for key in ("preset", "device", "gpus", "peak_tflops")} if setup else {}
    return {"steps": steps, "rows": rows, "ratios": ratios, "errors": errors, "setup": device}


def _next_to_times(names: list[str]) -> list[str]:
    """Row names with each phase's MFU rows right after its time."""
    mfu = [n for n in names if n.startswith(("mfu_", "reported_mfu_"))]
    ordered: list[str] = []
    for name in names:
        if name in mfu:
            continue
        ordered.append(name)
        phase = name.removesuffix("_s")
        ordered.extend(n for n in mfu if n in (f"mfu_{phase}", f"reported_mfu_{phase}"))
    return ordered


def _ratios(ours: dict[str, float | None], peer: dict[str, float | None]) -> dict[str, float | None]:
    return {name: ours[name] / peer[name] if ours[name] is not None and peer.get(name) else None for name in ours}


def print_table(table: dict[str, Any]) -> None:
    sides, pairs = list(table["steps"]), list(table["ratios"])
    cell = lambda v, w: f"{v:{w}.3f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"
    setup = table.get("setup") or {}
    if setup:
        print(f"\n{setup.get('preset')}: {setup.get('gpus')} x {setup.get('device')} (bf16 peak {setup.get('peak_tflops')} TFLOP/s)")
    print("\nsteady state (mean of steps 2..N); steps per side: " + ", ".join(f"{s} {n}" for s, n in table["steps"].items()))
    print(f"{'measure':<27}" + "".join(f"{s:>13}" for s in sides) + "".join(f"{p:>20}" for p in pairs))
    for name, values in table["rows"].items():
        print(f"{name:<27}" + "".join(cell(values[s], 13) for s in sides) + "".join(cell(table["ratios"][p][name], 20) for p in pairs))
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
