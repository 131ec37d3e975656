"""Does the default run learn? Baseline reward, final reward and wall time of `python -m trainer.main`.

    python -m benchmarks.learning [overrides...] [--out results/learning.json]

The baseline is the validation reward of the random-init model before training (step 0, greedy), and
the training reward of the first steps (sampled); the final figures are the same measures at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from trainer.config_loader import load_config
from trainer.main import run

MAX_TASK_REWARD = 1.0  # both synthetic scorers give at most 1 per response


def summarize(history: list[dict], wall_s: float, window: int = 5) -> dict:
    train = [r["reward/mean"] for r in history if "reward/mean" in r]
    val = [(r["step"], r["val/reward_mean"]) for r in history if "val/reward_mean" in r]
    return {
        "val_reward_baseline": val[0][1] if val else None,
        "val_reward_final": val[-1][1] if val else None,
        "train_reward_first_steps": float(np.mean(train[:window])) if train else None,
        "train_reward_last_steps": float(np.mean(train[-window:])) if train else None,
        "steps": len(train),
        "wall_s": wall_s,
        "target": 0.9 * MAX_TASK_REWARD,
    }


def report(result: dict, keys: Sequence[str], out: str, header: str = "measure") -> None:
    """Print `keys` of `result` as a two-column table and write the whole result as JSON to `out`."""
    width = max(len(header), *(len(k) for k in keys)) + 2
    print(f"\n{header:<{width}}value")
    for key in keys:
        value = result[key]
        print(f"{key:<{width}}{value:.3f}" if isinstance(value, float) else f"{key:<{width}}{value}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


def run_learning_benchmark(
    doc: str, default_out: str, load: Callable[[list[str]], Any], train: Callable[[Any], list[dict]],
    summarize_history: Callable[[list[dict], float], dict], measures: Sequence[str],
) -> None:
    """The command line of a learning benchmark: parse `--out` and hydra overrides, `train(load(overrides))`,
    then print `measures` of `summarize_history(history, wall_s)` and write all of it as JSON."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=default_out)
    args, overrides = parser.parse_known_args()
    cfg = load(overrides)
    start = time.perf_counter()
    history = train(cfg)
    result = summarize_history(history, time.perf_counter() - start)
    result.update(overrides=overrides, machine={"cpus": os.cpu_count(), "platform": platform.platform()})
    header = f"measure (first/last = mean of {result['window']} steps)" if "window" in result else "measure"
    report(result, measures, args.out, header=header)


def main() -> None:
    keys = ("val_reward_baseline", "val_reward_final", "train_reward_first_steps", "train_reward_last_steps", "steps", "wall_s", "target")
    run_learning_benchmark(__doc__, "results/learning.json", load_config, run, summarize, keys)


if __name__ == "__main__":
    main()
