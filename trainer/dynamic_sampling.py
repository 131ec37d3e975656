"""DAPO's dynamic sampling (verl's `algorithm.filter_groups`): train only on prompt groups whose responses
differ, drawing more prompts until a full batch of such groups is kept.

A group is the `rollout.n` responses of one prompt (one uid). Its responses are compared by
`filter_groups.metric`; a group whose values are all equal (std 0: every response right, or every one wrong)
gives GRPO a zero advantage everywhere and is dropped. Batches are generated until `data.train_batch_size`
groups are kept, and the kept groups are cut to exactly that many.

When `max_num_gen_batches` batches (0: as many as the dataset holds, each prompt once) still leave the batch
short, verl raises. Here the step goes on: the batch is filled up with dropped groups, in the order they
were generated (a zero-advantage group adds no policy gradient under GRPO; the step is then what plain GRPO
would have done with them), and `filter_groups/topped_up_groups` counts them. A task the policy has solved
would otherwise stop a long run late, or with no cap never end the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby

import numpy as np

from protocol import DataProto
from trainer.algorithm_names import FILTER_GROUPS_METRICS


@dataclass
class ScoredRollout:
    """A generated batch after reward: `rollout.batch["token_level_scores"]` is set; `rule_scores` [B] are the
    rule reward's scores (before the reward model and the overlong penalty); `metrics` the reward metrics."""

    rollout: DataProto
    rule_scores: np.ndarray
    metrics: dict[str, float] = field(default_factory=dict)
    reward_fn_s: float = 0.0  # driver seconds spent scoring


def metric_values(scored: ScoredRollout, metric: str) -> np.ndarray:
    """Each response's value of `metric` (trainer/algorithm_names.py: FILTER_GROUPS_METRICS)."""
    if metric in ("acc", "score"):  # a reward function returning one number: its score is its accuracy
        return scored.rule_scores
    if metric in ("seq_reward", "seq_final_reward"):  # the same before advantages (no KL in the reward: checked)
        return scored.rollout.batch["token_level_scores"].sum(-1).numpy()
    raise ValueError(
        f"algorithm.filter_groups.metric={metric!r} is not valid; choose one of {list(FILTER_GROUPS_METRICS)}"
    )


def split_groups(values: np.ndarray, uids: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The row indices of each group (same uid, in order of first appearance), split into mixed groups
    (values not all equal; a group of one response counts as mixed, as in verl) and uniform ones."""
    mixed, uniform = [], []
    for uid in dict.fromkeys(uids.tolist()):
        rows = np.flatnonzero(uids == uid)
        (mixed if len(rows) == 1 or np.std(values[rows]) > 0 else uniform).append(rows)
    return mixed, uniform


Group = tuple[int, np.ndarray]  # (index of the generated batch, its rows)


@dataclass
class MixedGroups:
    """Collects the groups of a step's generation batches: mixed ones to train on, uniform ones to fill up with."""

    target: int  # groups per training batch (data.train_batch_size)
    metric: str
    scored: list[ScoredRollout] = field(default_factory=list)
    mixed: list[Group] = field(default_factory=list)
    uniform: list[Group] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.mixed) >= self.target

    def add(self, scored: ScoredRollout) -> None:
        mixed, uniform = split_groups(metric_values(scored, self.metric), scored.rollout.non_tensor_batch["uid"])
        index = len(self.scored)
        self.scored.append(scored)
        self.mixed.extend((index, rows) for rows in mixed)
        self.uniform.extend((index, rows) for rows in uniform)

    def batch(self) -> tuple[ScoredRollout, dict[str, float]]:
        """Exactly `target` groups (the first mixed ones, filled up with uniform ones when too few) with their
        reward record (metrics averaged over every batch generated), and the counts."""
        kept = self.mixed[: self.target]
        topped_up = self.uniform[: self.target - len(kept)]
        if len(kept) + len(topped_up) < self.target:
            raise RuntimeError(f"{len(kept) + len(topped_up)} groups generated for a batch of {self.target}")
        rollout, rule_scores = self._take(kept + topped_up)
        generated = np.concatenate([s.rule_scores for s in self.scored])
        metrics = {key: float(np.mean([s.metrics[key] for s in self.scored])) for key in self.scored[0].metrics}
        metrics["generated_score_mean"] = float(generated.mean())  # every response of the step, filtered or not
        record = ScoredRollout(rollout, rule_scores, metrics, sum(s.reward_fn_s for s in self.scored))
        return record, {
            "filter_groups/gen_batches": len(self.scored),
            "filter_groups/mixed_groups": len(self.mixed),
            "filter_groups/uniform_groups": len(self.uniform),
            "filter_groups/trimmed_groups": len(self.mixed) - len(kept),
            "filter_groups/topped_up_groups": len(topped_up),
        }

    def _take(self, groups: list[Group]) -> tuple[DataProto, np.ndarray]:
        """The rows of `groups`, in their order: one selection per run of groups from the same batch."""
        parts, scores = [], []
        for index, run in groupby(groups, key=lambda group: group[0]):
            rows = np.concatenate([rows for _, rows in run])
            parts.append(self.scored[index].rollout[rows])
            scores.append(self.scored[index].rule_scores[rows])
        return DataProto.concat(parts), np.concatenate(scores)


def fill_with_mixed_groups(
    first: ScoredRollout, draw: Callable[[], ScoredRollout], target: int, metric: str, max_batches: int
) -> tuple[ScoredRollout, dict[str, float]]:
    """Keep the mixed groups of `first`, then of batches from `draw()`, until `target` groups are kept or
    `max_batches` batches (`first` included) were generated; returns the training batch with its reward
    record, and the counts (filter_groups/*)."""
    groups = MixedGroups(target, metric)
    groups.add(first)
    while not groups.full and len(groups.scored) < max_batches:
        groups.add(draw())
    return groups.batch()


def rows_per_prompt(prompts: DataProto, n: int) -> DataProto:
    """One row per prompt of a generation input whose prompts are repeated `n` times (adjacent copies)."""
    return prompts[np.arange(0, len(prompts), n)]
