"""Does the DAPO preset learn? `python -m trainer.main algorithm=dapo` on the default task, first vs last steps.

    python -m benchmarks.learning_dapo [overrides...] [--out results/learning_dapo.json]

Baselines come from the same run: the greedy validation reward of the initial model (step 0) and the
figures of the first steps. `train_reward` is what DAPO maximises (task score plus the overlong penalty, on
the groups trained on); `task_score` is the rule score of every response generated in the step, filtered
or not; the validation reward is the greedy task score without the penalty.
"""

from __future__ import annotations

from benchmarks.learning import run_learning_benchmark
from benchmarks.learning_dpo import window_mean
from trainer.config_loader import load_config
from trainer.main import run

MEASURES = (
    "val_reward_baseline", "val_reward_final", "train_reward_first_steps", "train_reward_last_steps",
    "task_score_first_steps", "task_score_last_steps", "overlong_penalty_first_steps", "overlong_penalty_last_steps",
    "response_length_first_steps", "response_length_last_steps", "gen_batches_mean", "topped_up_groups_total",
    "steps", "wall_s",
)


def summarize(history: list[dict], wall_s: float, window: int = 5) -> dict:
    train = [r for r in history if "reward/mean" in r]
    val = [r["val/reward_mean"] for r in history if "val/reward_mean" in r]
    first, last = train[:window], train[-window:]
    measures = {
        "train_reward": "reward/mean", "task_score": "reward/generated_score_mean",
        "overlong_penalty": "reward/overlong_penalty_mean", "response_length": "response/length_mean",
    }
    result = {
        "val_reward_baseline": val[0] if val else None,
        "val_reward_final": val[-1] if val else None,
        **{f"{name}_first_steps": window_mean(key, first) for name, key in measures.items()},
        **{f"{name}_last_steps": window_mean(key, last) for name, key in measures.items()},
        "gen_batches_mean": window_mean("filter_groups/gen_batches", train),
        "topped_up_groups_total": int(sum(r.get("filter_groups/topped_up_groups", 0) for r in train)),
        "steps": len(train),
        "window": window,
        "wall_s": wall_s,
    }
    return result


def main() -> None:
    overrides = ["algorithm=dapo", "trainer.experiment_name=tiny_dapo", "trainer.resume_mode=disable"]  # yours come after
    run_learning_benchmark(__doc__, "results/learning_dapo.json", lambda o: load_config([*overrides, *o]), run, summarize, MEASURES)


if __name__ == "__main__":
    main()
