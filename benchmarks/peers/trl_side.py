"""One TRL GRPOTrainer run on CPU (single process) with the matched settings; writes per-step JSON.

    python -m benchmarks.peers.trl_side --model DIR --train FILE --out FILE [--steps N] [--threads T]

Run by `benchmarks.peers.trl_cpu`, which builds the model and data and runs our side next to it. Needs
`trl` importable (not a dependency of the toolkit; see that module's docstring for what to install).
A "step" here is one rollout step (generation of 16 prompts x 8 samples and the optimizer steps on it),
i.e. `updates_per_step` TRL optimizer steps; its wall time runs from the end of the previous rollout
step (or the start of training) to the end of its last optimizer step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.peers.settings import MatchedGRPO, trl_config_kwargs
from trainer.rewards.char_class import compute_char_class_score


class RewardLog:
    """The reward function TRL calls once per generation batch; remembers each batch's mean."""

    __name__ = "char_class"  # TRL names its reward metric after the function

    def __init__(self) -> None:
        self.means: list[float] = []

    def __call__(self, completions: list[Any], reward_model: list[dict[str, str]], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        scores = [compute_char_class_score(t, rm["ground_truth"]) for t, rm in zip(texts, reward_model)]
        self.means.append(sum(scores) / len(scores))
        return scores


def time_method(obj: Any, name: str) -> list[float]:
    """Wrap `obj.name` so each call's wall time is appended to the returned list.

    Used on TRL's `_generate_and_score_completions` (generation, reward, old and reference log-probs, advantages:
    everything of a step before the optimizer steps), to split TRL's step like ours."""
    seconds: list[float] = []
    method = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    setattr(obj, name, timed)
    return seconds


def load_prompts(train: Path, columns: tuple[str, ...] = ("prompt", "reward_model")):
    """Our verl-layout parquet as a TRL dataset: the chat `prompt` and the columns the reward reads."""
    from datasets import Dataset

    return Dataset.from_parquet(str(train)).select_columns(list(columns))


def side_parser(description: str, default_steps: int) -> argparse.ArgumentParser:
    """The arguments of a TRL side script: model folder, parquet, output JSON, steps."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=default_steps)
    return parser


def run(model: Path, train: Path, out_dir: Path, settings: MatchedGRPO) -> dict[str, Any]:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    rewards, clock = RewardLog(), StepClock()
    start = time.perf_counter()
    trainer = GRPOTrainer(model=str(model), reward_funcs=rewards, args=GRPOConfig(**trl_config_kwargs(settings, out_dir)),
                          train_dataset=load_prompts(train), callbacks=[clock])
    setup_s = time.perf_counter() - start
    rollout_s = time_method(trainer, "_generate_and_score_completions")
    trainer.train()
    run_s = time.perf_counter() - start
    per = settings.updates_per_step
    marks = clock.ends[::per]  # train start, then the end of every rollout step's last optimizer step
    step_s = [b - a for a, b in zip(marks, marks[1:])]
    return {"setup_s": setup_s, "run_s": run_s, "step_s": step_s, "reward_mean": rewards.means, "rollout_s": rollout_s,
            "torch_threads": torch.get_num_threads(), "optimizer_steps": len(clock.ends) - 1}


def main() -> None:
    parser = side_parser(__doc__, MatchedGRPO.steps)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import trl

    result = run(args.model, args.train, args.out.parent / "trl_run", MatchedGRPO(steps=args.steps))
    result["trl_version"] = trl.__version__
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
