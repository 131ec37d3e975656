"""Does the default RAFT run learn? Task reward and SFT loss (NLL of the kept responses), first vs last steps.

    python -m benchmarks.learning_raft [overrides...] [--out results/learning_raft.json]

Runs `recipes.raft` with its defaults (plus any hydra overrides). Baselines come from the same run: the
greedy validation reward of the initial model (step 0) and the sampled reward and NLL of the first steps.
"""

from __future__ import annotations

from benchmarks.learning import run_learning_benchmark
from benchmarks.learning_dpo import window_mean
from recipes import raft
from trainer.recipe_runner import load_recipe_config

MEASURES = (
    "val_reward_baseline", "val_reward_final", "train_reward_first_steps", "train_reward_last_steps",
    "sft_loss_first_steps", "sft_loss_last_steps", "kept_mean", "first_step_reward_0_9", "steps", "wall_s",
)


def summarize(history: list[dict], wall_s: float, window: int = 5) -> dict:
    train = [r for r in history if "reward/mean" in r]
    val = [r["val/reward_mean"] for r in history if "val/reward_mean" in r]
    first, last = train[:window], train[-window:]
    reached = [r["step"] for r in train if r["reward/mean"] >= 0.9]
    return {
        "val_reward_baseline": val[0] if val else None,
        "val_reward_final": val[-1] if val else None,
        "train_reward_first_steps": window_mean("reward/mean", first),
        "train_reward_last_steps": window_mean("reward/mean", last),
        "sft_loss_first_steps": window_mean("actor/sft_loss", first),
        "sft_loss_last_steps": window_mean("actor/sft_loss", last),
        "kept_mean": window_mean("raft/kept", train),
        "first_step_reward_0_9": reached[0] if reached else None,
        "steps": len(train),
        "window": window,
        "wall_s": wall_s,
    }


def main() -> None:
    run_learning_benchmark(__doc__, "results/learning_raft.json", lambda o: load_recipe_config(raft, o), raft.run, summarize, MEASURES)


if __name__ == "__main__":
    main()
