"""verl's `custom_reward_function` for the synthetic arithmetic task: the toolkit's own scorer.

verl calls `compute_score(data_source, solution_str, ground_truth, extra_info)` in its reward workers.
The scorer file is loaded by path, not through the `trainer` package, so verl's processes import nothing
else of the toolkit (its package pulls in this project's tensordict version, which verl's does not share).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

_SCORER_FILE = Path(__file__).resolve().parents[2] / "trainer" / "rewards" / "math_answer.py"
_spec = importlib.util.spec_from_file_location("peers_math_answer", _SCORER_FILE)
_scorer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_scorer)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    if data_source != "synthetic/arithmetic":
        raise ValueError(f"benchmarks/peers/verl_reward.py scores synthetic/arithmetic only, got data_source {data_source!r}")
    return _scorer.compute_math_answer_score(solution_str, ground_truth)
