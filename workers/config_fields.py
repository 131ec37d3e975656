"""Leaf fields of the worker configs: a check that returns the normalised value or raises ValueError, and the
words an error shows for what is allowed (workers/config.py builds its specs from them; the defaults are in
workers/defaults/*.yaml)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

@dataclass(frozen=True)
class Field:
    """One leaf key: a check returning the normalised value or raising ValueError."""

    check: Callable[[Any], Any]
    expected: str  # shown in errors, e.g. "an int >= 1"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def float_in(low: float | None = None, high: float | None = None, low_open: bool = False) -> Callable[[Any], Any]:
    def check(value: Any) -> float:
        ok = is_number(value)
        ok = ok and (low is None or (value > low if low_open else value >= low)) and (high is None or value <= high)
        if not ok:
            raise ValueError
        return float(value)

    return check


def int_at_least(low: int) -> Callable[[Any], Any]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError
        return value

    return check


def any_int(value: Any) -> int:
    """Any integer, negative ones included (verl's `lr_warmup_steps=-1` means "use the ratio")."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError
    return value


def optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else inner(value)


def one_of(*choices: Any) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value not in choices:
            raise ValueError
        return value

    return check


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError
    return value


def non_empty_str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError
    return value


def token_ids(value: Any) -> int | list[int]:
    if isinstance(value, (list, tuple)) and value and all(int_at_least(0)(v) is not None for v in value):
        return [int(v) for v in value]
    return int_at_least(0)(value)


def betas(value: Any) -> list[float]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError
    return [float_in(0.0, 1.0)(v) for v in value]


def spec_list(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and ":" in v for v in value):
        raise ValueError
    return list(value)


def config_fields(value: Any) -> dict[str, Any]:
    """A model's `override_config`: config.json field names (strings) to values."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise ValueError
    return dict(value)


def engine_kwargs_mapping(value: Any) -> dict[str, Any]:
    """verl's `rollout.engine_kwargs`: {vllm: {name: value}}; the names are checked against vLLM where it runs."""
    if not isinstance(value, Mapping) or set(value) - {"vllm"} or not isinstance(value.get("vllm") or {}, Mapping):
        raise ValueError
    return {"vllm": dict(value.get("vllm") or {})}


def module_names(value: Any) -> str | list[str]:
    """A PEFT module selector: one name / "all-linear", or a non-empty list of names."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v for v in value):
        return list(value)
    raise ValueError
