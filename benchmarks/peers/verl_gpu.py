"""verl's GRPO (`main_ppo`) and ours (`benchmarks.e2e_step`) back to back on one GPU, then one table.

    python -m benchmarks.peers.verl_gpu [--steps 5] [--out-dir results/peers_gpu] [--order ours,verl]

Both sides get the model folder and parquet that `benchmarks/e2e_step.py` builds (the 0.5B-shaped random-init
Qwen2 with the character tokenizer; synthetic arithmetic, 256 rows) and the settings of `verl_settings.py`.
Each runs in its own process with its own packages: verl with `/tmp/verl_site` (benchmarks/peers/verl_bundle.sh)
first on PYTHONPATH, ours without it. Each gets a time limit, so one that hangs still leaves the other's
figures. Writes to --out-dir: verl_metrics.jsonl (verl's file logger), verl_log.txt, ours_e2e.json,
ours_log.txt, runs.json (wall time, exit code, NVML peak memory of each run) and peers_gpu.json (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.compare import compare, print_table
from benchmarks.peers.gpu_memory import PeakGpuMemory
from benchmarks.peers.verl_settings import verl_overrides

VERL_SITE = "/tmp/verl_site"


def run_logged(command: list[str], env: dict[str, str], log: Path, timeout_s: float) -> dict[str, Any]:
    """Run `command` in its own process group with output to `log`; kill the group at `timeout_s`."""
    start = time.perf_counter()
    with open(log, "w") as out, PeakGpuMemory() as memory:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = "timeout"
    return {"command": command, "exit": code, "wall_s": time.perf_counter() - start,
            "gpu_used_peak_gib": memory.peak_gib, "gpu_used_before_gib": memory.baseline_gib}


def base_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
               VLLM_USE_FLASHINFER_SAMPLER="0", CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0"))
    return env


def run_verl(work: Path, out: Path, steps: int, timeout_s: float, extra: list[str]) -> dict[str, Any]:
    size = work / "0.5B"
    overrides = verl_overrides(size / "model", size / "data" / "train.parquet", size / "data" / "val.parquet", work, steps)
    paths = [VERL_SITE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != Path.cwd()]
    env = dict(base_env(), PYTHONPATH=os.pathsep.join(paths), VERL_FILE_LOGGER_PATH=str(out / "verl_metrics.jsonl"))
    (out / "verl_metrics.jsonl").unlink(missing_ok=True)
    # A fresh local Ray instance, never one that happens to be running already.
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, "+ray_kwargs.ray_init.address=local", *extra]
    # The Ray services verl's driver starts share its process group (and die with it), so a timeout's group
    # kill ends them too; nothing machine-wide such as `ray stop` is needed.
    return run_logged(command, env, out / "verl_log.txt", timeout_s)


def run_ours(work: Path, out: Path, steps: int, timeout_s: float) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.e2e_step", "--sizes", "0.5B", "--steps", str(steps),
               "--workdir", str(work), "--out", str(out / "ours_e2e.json")]
    return run_logged(command, base_env(), out / "ours_log.txt", timeout_s)


def build_inputs(work: Path) -> None:
    """The model folder and parquet exactly as e2e_step's run_size builds them (it rebuilds the same bytes)."""
    from benchmarks.e2e_step import SHAPES
    from benchmarks.gpu_grpo_step import build_model
    from trainer.datasets.synthetic import write_synthetic_dataset

    build_model(work / "0.5B" / "model", SHAPES["0.5B"])
    write_synthetic_dataset(work / "0.5B" / "data", train_size=256, val_size=16, tasks=("arithmetic",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/peers_gpu"))
    parser.add_argument("--out-dir", type=Path, default=Path(os.environ.get("OUT", "results/peers_gpu")))
    parser.add_argument("--order", default="ours,verl", help="comma list of ours, verl")
    parser.add_argument("--ours-timeout", type=float, default=200)
    parser.add_argument("--verl-timeout", type=float, default=330)
    parser.add_argument("--verl-extra", nargs="*", default=[], help="more verl overrides, e.g. trainer.use_v1=false")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    build_inputs(args.workdir)
    runs: dict[str, Any] = {}
    for side in args.order.split(","):
        if side == "verl":
            runs["verl"] = run_verl(args.workdir, args.out_dir, args.steps, args.verl_timeout, args.verl_extra)
        elif side == "ours":
            runs["ours"] = run_ours(args.workdir, args.out_dir, args.steps, args.ours_timeout)
        else:
            raise SystemExit(f"--order takes ours and verl, got {side!r}")
        print(f"{side}: exit {runs[side]['exit']}, {runs[side]['wall_s']:.0f} s, GPU peak {runs[side]['gpu_used_peak_gib']:.1f} GiB", flush=True)
        (args.out_dir / "runs.json").write_text(json.dumps(runs, indent=2))
    verl_file, ours_file = args.out_dir / "verl_metrics.jsonl", args.out_dir / "ours_e2e.json"
    if verl_file.exists() and ours_file.exists():
        table = compare(verl_file, ours_file, args.out_dir / "runs.json")
        print_table(table)
        (args.out_dir / "peers_gpu.json").write_text(json.dumps(table, indent=2))
    else:
        for side, log in (("verl", "verl_log.txt"), ("ours", "ours_log.txt")):
            if (args.out_dir / log).exists():
                print(f"--- last lines of {side}'s log ---\n" + "\n".join((args.out_dir / log).read_text().splitlines()[-40:]))


if __name__ == "__main__":
    main()
