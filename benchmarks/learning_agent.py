"""Does the tiny model learn to use a tool? `python -m trainer.main task=tool_vault` from random init.

    python -m benchmarks.learning_agent [overrides...] [--out results/learning_agent.json]

Reports the reward and the tool-use rate (share of samples that called the tool) of the first and last
steps, greedy validation before and after, and when the 5-step mean training reward first reached the
target (0.8 of the maximum reward 1.0), in steps and in seconds since the start of the run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from benchmarks.learning import report
from trainer.config_loader import load_config
from trainer.main import run
from workers.agent_tasks.vault import ANSWER_CREDIT, CALL_CREDIT

TARGET = 0.8 * (CALL_CREDIT + ANSWER_CREDIT)


def first_crossing(history: list[dict], start_s: float, end_s: float, window: int = 5) -> tuple[int | None, float | None]:
    """(step, seconds since start) where the `window`-step mean reward first reached TARGET. Seconds: the
    run's set-up time (everything outside the steps) plus the steps' wall time up to there."""
    rewards = [r["reward/mean"] for r in history]
    walls = [r.get("timing/wall_step_s", 0.0) for r in history]
    setup = (end_s - start_s) - sum(walls)
    for i in range(window - 1, len(rewards)):
        if np.mean(rewards[i - window + 1 : i + 1]) >= TARGET:
            return history[i]["step"], setup + sum(walls[: i + 1])
    return None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/learning_agent.json")
    args, overrides = parser.parse_known_args()
    overrides = ["task=tool_vault", "trainer.total_training_steps=80", "trainer.test_freq=20", *overrides]
    cfg = load_config(overrides)
    start = time.perf_counter()
    history = run(cfg)
    end = time.perf_counter()
    train = [r for r in history if "reward/mean" in r]
    val = [r["val/reward_mean"] for r in history if "val/reward_mean" in r]
    step, seconds = first_crossing(train, start, end)
    result = {
        "val_reward_baseline": val[0] if val else None,
        "val_reward_final": val[-1] if val else None,
        "train_reward_first_steps": float(np.mean([r["reward/mean"] for r in train[:5]])),
        "train_reward_last_steps": float(np.mean([r["reward/mean"] for r in train[-5:]])),
        "tool_use_first_steps": float(np.mean([r["agent/tool_use_rate"] for r in train[:5]])),
        "tool_use_last_steps": float(np.mean([r["agent/tool_use_rate"] for r in train[-5:]])),
        "target": TARGET,
        "target_step": step,
        "target_s": seconds,
        "steps": len(train),
        "wall_s": end - start,
        "overrides": overrides,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "curve": [(r["step"], r["reward/mean"], r["agent/tool_use_rate"]) for r in train],
    }
    keys = ("val_reward_baseline", "val_reward_final", "train_reward_first_steps", "train_reward_last_steps",
            "tool_use_first_steps", "tool_use_last_steps", "target", "target_step", "target_s", "steps", "wall_s")
    report(result, keys, args.out)


if __name__ == "__main__":
    main()
