"""The default reward function: pick a rule-based scorer by `data_source`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .char_class import compute_char_class_score
from .math_answer import compute_math_answer_score

# data_source -> scorer(solution_str, ground_truth) -> float. Add new rule tasks here.
SCORERS: dict[str, Callable[[str, str], float]] = {
    "synthetic/char_class": compute_char_class_score,
    "synthetic/visual_colors": compute_char_class_score,  # the picture's colour picks the class (docs/vision.md)
    "synthetic/arithmetic": compute_math_answer_score,
    "openai/gsm8k": compute_math_answer_score,
}


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None
) -> float:
    """Score one decoded response; `extra_info` is accepted for verl compatibility and unused."""
    scorer = SCORERS.get(data_source)
    if scorer is None:
        raise ValueError(
            f"no default scorer for data_source {data_source!r}; known: {sorted(SCORERS)}. "
            "Point the config's custom reward function at your own compute_score for other data."
        )
    return float(scorer(solution_str, ground_truth))
