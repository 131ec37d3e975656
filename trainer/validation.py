"""Validation of the actor: `actor_rollout_ref.rollout.val_kwargs` sampling (verl's: greedy by default, each
prompt `n` times), scored by the run's reward manager (the trainer's `val/` metrics), and the samples
`trainer.log_val_generations` shows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocol import DataProto
from protocol.meta_merge import SEED_KEY
from trainer.rewards.managers import task_scores
from trainer.val_generations import decoded_generations, pick_generations


@dataclass(frozen=True)
class ValSampling:
    """verl's `rollout.val_kwargs`: how validation samples (defaults: greedy, one response per prompt)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): off
    do_sample: bool = False
    n: int = 1

    @classmethod
    def from_config(cls, val_kwargs: Mapping[str, Any] | None) -> "ValSampling":
        settings = dict(val_kwargs or {})
        return cls(**{name: settings[name] for name in cls.__dataclass_fields__ if name in settings})

    @property
    def samples(self) -> bool:
        """Whether validation samples: do_sample with a temperature above 0 (0 is greedy, as in vLLM)."""
        return bool(self.do_sample) and float(self.temperature) > 0

    def meta_info(self) -> dict[str, Any]:
        """The generate call's sampling overrides (workers/rollout/sampling.py: GENERATION_OVERRIDES)."""
        if not self.samples:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": float(self.temperature), "top_p": float(self.top_p),
                "top_k": max(int(self.top_k), 0)}


@dataclass
class ValidationResult:
    metrics: dict[str, float] = field(default_factory=dict)
    generations: list[dict[str, Any]] = field(default_factory=list)  # input, output, score of the samples shown


def validation_seed(seed: int, step: int, batch: int) -> int:
    """The sampling seed of one validation batch: reproducible, apart from the training batches' seeds."""
    return int(np.random.SeedSequence([seed, step, batch, 0x7A1]).generate_state(1)[0])


def validate(
    generator: Any, val_batches: list[DataProto], reward_fn: Any, sampling: ValSampling = ValSampling(),
    *, tokenizer: Any = None, log_generations: int = 0, seed: int = 0, step: int = 0,
) -> ValidationResult:
    """Generate `sampling.n` responses per validation prompt and score them. Metrics: `val/reward_mean` and
    `val/<data_source>/reward_mean` (each response's task score: before the dapo manager's overlong penalty, as
    verl's acc), and with n > 1 verl's per-prompt `val/<data_source>/reward/mean@n` and `std@n`; none without
    batches. `generator` has `generate_sequences(DataProto)` (the run's rollout source, which syncs the engines
    first, or a worker group).
    `log_generations` > 0 also returns that many decoded samples (needs `tokenizer`)."""
    scores, totals, sources, shown = [], [], [], []
    for index, batch in enumerate(val_batches):
        keys = ["input_ids", "attention_mask", "position_ids"]
        batch = batch.select(batch_keys=keys, non_tensor_batch_keys=list(batch.non_tensor_batch))
        batch = batch.repeat(sampling.n, interleave=True) if sampling.n > 1 else batch  # a prompt's copies adjacent
        batch.meta_info.update(sampling.meta_info())
        if sampling.samples:
            batch.meta_info[SEED_KEY] = validation_seed(seed, step, index)
        out = generator.generate_sequences(batch)
        token_scores, task, _ = task_scores(reward_fn, out)
        scores.append(task.numpy())
        totals.append(token_scores.sum(-1).numpy())
        sources.extend(out.non_tensor_batch["data_source"])
        if log_generations > 0:
            shown.extend(decoded_generations(tokenizer, batch, out, totals[-1]))
    if not scores:
        return ValidationResult()
    return ValidationResult(score_metrics(np.concatenate(scores), np.asarray(sources), sampling.n),
                            pick_generations(shown, log_generations))


def score_metrics(scores: np.ndarray, sources: np.ndarray, n: int) -> dict[str, float]:
    """The validation metrics of `scores` [P * n] (a prompt's n responses adjacent) from `sources`."""
    metrics = {"val/reward_mean": float(scores.mean())}
    for source in sorted(set(sources.tolist())):
        mine = scores[sources == source]
        metrics[f"val/{source}/reward_mean"] = float(mine.mean())
        if n > 1:  # per prompt over its n responses, then over the prompts (verl's mean@n, std@n)
            per_prompt = mine.reshape(-1, n)
            metrics[f"val/{source}/reward/mean@{n}"] = float(per_prompt.mean(-1).mean())
            metrics[f"val/{source}/reward/std@{n}"] = float(per_prompt.std(-1).mean())
    return metrics
