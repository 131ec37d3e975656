"""Scorer for `synthetic/char_class`: partial credit for writing characters of one class.

The prompt asks for N characters of a class ("write 8 digits."). The score is the
fraction of the first N response characters that belong to the class, so every
correct character earns credit and a random policy scores far below 1.0. Missing
characters (a response shorter than N) count as wrong, so stopping early never pays.
The dataset generator (trainer/datasets/synthetic.py) imports CHAR_CLASSES from here,
so prompts and scoring can not drift apart.
"""

from __future__ import annotations

import string

CHAR_CLASSES: dict[str, frozenset[str]] = {
    "digits": frozenset(string.digits),
    "vowels": frozenset("aeiouAEIOU"),
    "symbols": frozenset("+-*/=#"),
}
DEFAULT_LENGTH = 8


def parse_char_class_target(ground_truth: str) -> tuple[str, int]:
    """`"digits:8"` -> ("digits", 8); a bare class name uses DEFAULT_LENGTH."""
    name, _, length_text = str(ground_truth).strip().partition(":")
    if name not in CHAR_CLASSES:
        raise ValueError(
            f"char_class ground_truth {ground_truth!r}: unknown class {name!r}; known: {sorted(CHAR_CLASSES)}"
        )
    try:
        length = int(length_text) if length_text else DEFAULT_LENGTH
    except ValueError:
        raise ValueError(
            f"char_class ground_truth {ground_truth!r}: length {length_text!r} is not an integer"
        ) from None
    if length <= 0:
        raise ValueError(f"char_class ground_truth {ground_truth!r}: length must be positive")
    return name, length


def compute_char_class_score(solution_str: str, ground_truth: str) -> float:
    """Fraction of the first N characters of `solution_str` in the requested class."""
    name, length = parse_char_class_target(ground_truth)
    allowed = CHAR_CLASSES[name]
    hits = sum(ch in allowed for ch in solution_str[:length])
    return hits / length
