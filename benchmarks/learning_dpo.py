"""Does the default online DPO run learn? Task reward and implicit-reward accuracy, first vs last steps.

    python -m benchmarks.learning_dpo [overrides...] [--out results/learning_dpo.json]

Runs `recipes.online_dpo` with its defaults (plus any hydra overrides). Baselines come from the same run:
the greedy validation reward of the initial model (step 0) and the sampled task reward and DPO accuracy
of the first steps (at step 1 the policy equals the reference, so its accuracy is 0 by construction).
"""

from __future__ import annotations

import numpy as np

from benchmarks.learning import run_learning_benchmark
from recipes.config import load_recipe_config
from recipes.online_dpo import run

MEASURES = (
    "val_reward_baseline", "val_reward_final", "train_reward_first_steps", "train_reward_last_steps",
    "dpo_accuracy_first_steps", "dpo_accuracy_last_steps", "dpo_loss_first_steps", "dpo_loss_last_steps",
    "pairs_formed_mean", "pairs_dropped_total", "steps", "wall_s",
)


def window_mean(key: str, rows: list[dict]) -> float | None:
    """Mean of `key` over the rows that have it; None when none does."""
    values = [r[key] for r in rows if key in r]
    return float(np.mean(values)) if values else None


def summarize(history: list[dict], wall_s: float, window: int = 5) -> dict:
    train = [r for r in history if "reward/mean" in r]
    val = [r["val/reward_mean"] for r in history if "val/reward_mean" in r]
    mean = window_mean
    first, last = train[:window], train[-window:]
    return {
        "val_reward_baseline": val[0] if val else None,
        "val_reward_final": val[-1] if val else None,
        "train_reward_first_steps": mean("reward/mean", first),
        "train_reward_last_steps": mean("reward/mean", last),
        "dpo_accuracy_first_steps": mean("dpo/accuracy", first),
        "dpo_accuracy_last_steps": mean("dpo/accuracy", last),
        "dpo_loss_first_steps": mean("dpo/loss", first),
        "dpo_loss_last_steps": mean("dpo/loss", last),
        "pairs_formed_mean": mean("pairs/formed", train),
        "pairs_dropped_total": int(sum(r["pairs/dropped"] for r in train)),
        "steps": len(train),
        "window": window,
        "wall_s": wall_s,
    }


def main() -> None:
    run_learning_benchmark(__doc__, "results/learning_dpo.json", lambda o: load_recipe_config("online_dpo", o), run, summarize, MEASURES)


if __name__ == "__main__":
    main()
