"""GRPO on CPU side by side: TRL's GRPOTrainer vs `python -m trainer.main` (one worker and two), one run.

    PYTHONPATH=/tmp/trl_site python -m benchmarks.peers.trl_cpu [--steps 60] [--rounds 1] [--out results/peers_trl_cpu.json]

TRL is not a dependency of the toolkit and this script installs nothing. Install it into a folder of its
own, so that it does not replace the toolkit's torch/transformers, and put that folder on PYTHONPATH:

    python -m pip install --target /tmp/trl_site --no-deps trl==1.16.0 datasets pandas xxhash "multiprocess<0.70.20"

Both sides get the same tiny model folder and the same synthetic char_class parquet (built here with
`trainer.tiny_model` / `trainer.datasets.synthetic`, seed 0) and the settings of `benchmarks/peers/settings.py`.
Each side runs in its own process. Our workers are Ray actors, which Ray starts with one torch thread each,
so the pairs that use the same number of cores run back to back: TRL with 1 torch thread next to our
1 worker, TRL with torch's default threads (all cores) next to our 2 workers. `--rounds 2` repeats the
sequence in reverse order, to even out load from other processes on a shared machine.
Reported per side: median wall time of the steady-state steps (2..N) and of their rollout part (everything
but the actor update: TRL's `_generate_and_score_completions`, our other phases), first/last-5-step mean training
reward, whole-command wall time; and the ratios ours/TRL of the matched pairs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.settings import MatchedGRPO, ours_overrides
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.tiny_model import build_tiny_model

INSTALL_HINT = (
    "TRL is not importable. It is not a dependency of this toolkit; install it into its own folder and put it on "
    'PYTHONPATH:\n  python -m pip install --target /tmp/trl_site --no-deps trl==1.16.0 datasets pandas xxhash "multiprocess<0.70.20"\n'
    "  PYTHONPATH=/tmp/trl_site python -m benchmarks.peers.trl_cpu"
)
# (name, kind, cores): TRL threads or our worker count; pairs of equal cores run back to back.
SIDES = (("trl_1thread", "trl", 1), ("ours_1worker", "ours", 1), ("trl_default_threads", "trl", 0), ("ours_2workers", "ours", 2))
WINDOW = 5
# Our phases that TRL's `_generate_and_score_completions` also covers (all but the actor update).
ROLLOUT_PHASES = ("sync_weights", "generate", "reward", "old_log_prob", "ref_log_prob", "advantage")


def run_trl(model: Path, train: Path, work: Path, steps: int, threads: int) -> dict[str, Any]:
    out = work / "trl.json"
    command = [sys.executable, "-m", "benchmarks.peers.trl_side", "--model", str(model), "--train", str(train),
               "--out", str(out), "--steps", str(steps)] + (["--threads", str(threads)] if threads else [])
    wall_s = run_command(command, work)
    result = json.loads(out.read_text())
    return {"step_s": result["step_s"], "reward": result["reward_mean"], "rollout_s": result.get("rollout_s", []), "command_s": wall_s,
            "torch_threads": result["torch_threads"], "version": result["trl_version"]}


def run_ours(model: Path, train: Path, val: Path, work: Path, steps: int, workers: int) -> dict[str, Any]:
    settings = MatchedGRPO(steps=steps)
    command = [sys.executable, "-m", "trainer.main", *ours_overrides(settings, model, train, val, work / "run", workers)]
    wall_s = run_command(command, work)
    history = [json.loads(line) for line in (work / "run" / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {"step_s": [r["timing/wall_step_s"] for r in history], "reward": [r["reward/mean"] for r in history],
            "rollout_s": [sum(r[f"timing/{phase}_s"] for phase in ROLLOUT_PHASES) for r in history],
            "command_s": wall_s, "torch_threads": 1, "workers": workers}


def run_command(command: list[str], work: Path) -> float:
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled", PYTHONWARNINGS="ignore")
    start = time.perf_counter()
    with open(work / "log.txt", "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... failed ({done.returncode}); see {work / 'log.txt'}")
    return time.perf_counter() - start


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    steady = run["step_s"][1:] or run["step_s"]
    rollout = run.get("rollout_s", [])[1:]
    return {"median_step_s": statistics.median(steady), "mean_step_s": statistics.fmean(steady),
            "median_rollout_s": statistics.median(rollout) if rollout else float("nan"),
            "reward_first5": statistics.fmean(run["reward"][:WINDOW]), "reward_last5": statistics.fmean(run["reward"][-WINDOW:]),
            "steps": len(run["step_s"]), "command_s": run["command_s"], "torch_threads": run["torch_threads"]}


def load_average() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=MatchedGRPO.steps)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the sequence (every other round reversed)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/peers_trl_cpu"))
    parser.add_argument("--out", default="results/peers_trl_cpu.json")
    args = parser.parse_args()
    if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
        sys.exit(INSTALL_HINT)
    model = build_tiny_model(args.workdir / "model", seed=MatchedGRPO.seed)
    train, val = write_synthetic_dataset(args.workdir / "data", seed=MatchedGRPO.seed)
    runs: list[dict[str, Any]] = []
    for round_index in range(args.rounds):
        for name, kind, cores in (SIDES if round_index % 2 == 0 else SIDES[::-1]):
            work = args.workdir / f"round{round_index}" / name
            load_before = load_average()
            if kind == "trl":
                run = run_trl(model, train, work, args.steps, cores)
            else:
                run = run_ours(model, train, val, work, args.steps, cores)
            run.update(name=name, round=round_index, load_before=load_before, load_after=load_average())
            runs.append(run)
            print(f"round {round_index} {name}: median step {summarize(run)['median_step_s']:.3f} s, "
                  f"load {load_before:.1f} -> {run['load_after']:.1f}", flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).with_suffix(".partial.json").write_text(json.dumps(runs, indent=2))  # survives a later failure
    table = report(runs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "settings": MatchedGRPO(steps=args.steps).as_dict(), "table": table, "runs": runs,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }, indent=2))
    print(f"wrote {args.out}")


def report(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per side: the medians over rounds of each summary figure; then the ratios of the matched pairs."""
    table: dict[str, dict[str, Any]] = {}
    for name, _, _ in SIDES:
        summaries = [summarize(r) for r in runs if r["name"] == name]
        table[name] = {key: statistics.median(s[key] for s in summaries) for key in summaries[0]}
    print(f"\n{'side':<22}{'median step s':>14}{'rollout part s':>15}{'reward first5':>15}{'reward last5':>14}{'command s':>11}{'threads':>9}")
    for name, row in table.items():
        print(f"{name:<22}{row['median_step_s']:>14.3f}{row['median_rollout_s']:>15.3f}{row['reward_first5']:>15.3f}"
              f"{row['reward_last5']:>14.3f}{row['command_s']:>11.1f}{row['torch_threads']:>9}")
    for ours, trl in (("ours_1worker", "trl_1thread"), ("ours_2workers", "trl_default_threads")):
        ratio = table[ours]["median_step_s"] / table[trl]["median_step_s"]
        table[f"{ours}/{trl}"] = {"step_time_ratio": ratio}
        print(f"step time {ours} / {trl}: {ratio:.2f}")
    return table


if __name__ == "__main__":
    main()
