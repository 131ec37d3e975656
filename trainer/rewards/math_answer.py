"""Scorer for answers marked GSM8K-style: the reply ends with `#### <number>`.

Used for `synthetic/arithmetic` and `openai/gsm8k`. The LAST `#### n` in the reply is
the answer (models often restate the format before answering). Exact numeric match
scores 1.0. A well-formed but wrong answer scores `format_score`, 0.0 by default as
in verl's GSM8K scorer; pass e.g. 0.1 (functools.partial) to reward the format while
a model is still learning it. No `#### n` at all scores 0.0.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number after ####: optional sign, digits with optional thousands commas, optional decimals.
_ANSWER_RE = re.compile(r"####\s*(-?\$?\s*[0-9][0-9,]*(?:\.[0-9]+)?)")


def extract_answer(solution_str: str) -> str | None:
    """The number after the last `####`, with `$`, commas and spaces removed; None if absent."""
    matches = _ANSWER_RE.findall(solution_str)
    if not matches:
        return None
    return re.sub(r"[\s$,]", "", matches[-1])


def _normalize(number: str) -> Decimal | str:
    """Compare numerically when possible so "33", "33.0" and "1,000"/"1000" match."""
    cleaned = re.sub(r"[\s$,]", "", str(number))
    try:
        return Decimal(cleaned)
    except InvalidOperation:
        return cleaned


def compute_math_answer_score(solution_str: str, ground_truth: str, format_score: float = 0.0) -> float:
    """1.0 for the right `#### n`, `format_score` for a wrong one, 0.0 when there is none."""
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    return 1.0 if _normalize(answer) == _normalize(ground_truth) else format_score
