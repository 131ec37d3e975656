"""How many training prompts were filtered or truncated for length, reported once and in every step's metrics.

A run that silently drops or cuts prompts trains on other data than the user thinks; the counts are
printed at start and logged as `data/filtered_prompts` and `data/truncated_prompts` with each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from trainer.tracking import Tracker


def prompt_counts(dataset: Any) -> dict[str, int]:
    return {
        "data/prompts": len(dataset),
        "data/filtered_prompts": int(getattr(dataset, "num_filtered", 0)),
        "data/truncated_prompts": int(getattr(dataset, "num_truncated", 0)),
    }


def describe(
    counts: dict[str, int], max_prompt_length: int, truncation: str, filter_overlong: bool = False
) -> str:
    """One line for the console; says nothing was cut when nothing was, and which setting dropped prompts."""
    filtered, truncated = counts["data/filtered_prompts"], counts["data/truncated_prompts"]
    if not filtered and not truncated:
        return (
            f"data: {counts['data/prompts']} training prompts, none longer than max_prompt_length={max_prompt_length}"
        )
    setting = "data.filter_overlong_prompts=true" if filter_overlong else f"data.truncation={truncation}"
    return (
        f"data: {counts['data/prompts']} training prompts; longer than max_prompt_length={max_prompt_length}: "
        f"{filtered} filtered, {truncated} truncated ({setting})"
    )


class StepCountsTracker(Tracker):
    """A Tracker that adds fixed counts to every training step's record (step >= 1). The counts are known once
    the data is loaded (`set_counts`), after the tracker started (before Ray, so a bad tracker fails first)."""

    def __init__(self, backends: Sequence[str], log_dir: str | Path, counts: dict[str, int] | None = None,
                 print_fn=print, **run: Any) -> None:
        super().__init__(backends, log_dir, print_fn=print_fn, **run)
        self.counts = dict(counts or {})

    def set_counts(self, counts: dict[str, int]) -> None:
        self.counts = dict(counts)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        super().log({**metrics, **self.counts} if step >= 1 else metrics, step)
