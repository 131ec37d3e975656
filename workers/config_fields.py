"""Leaf fields of the worker configs: the type a value must have, as pydantic reads it (bounds and choices
included), and the words an error shows for what is allowed. workers/config.py builds a pydantic model of each
section from them (workers/config_schema.py); the defaults are in workers/defaults/*.yaml."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BeforeValidator, StrictBool, StrictInt, StrictStr
from pydantic import Field as Bound


@dataclass(frozen=True)
class Field:
    """One leaf key: the pydantic type of its value and what an error says is allowed."""

    kind: Any
    expected: str  # shown in errors, e.g. "an int >= 1"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _a_number(value: Any) -> Any:
    """pydantic's float also takes "1.5" and True; a setting here takes numbers only."""
    if not is_number(value):
        raise ValueError("not a number")
    return value


def float_in(low: float | None = None, high: float | None = None, low_open: bool = False) -> Any:
    bounds: dict[str, float] = {}
    if low is not None:
        bounds["gt" if low_open else "ge"] = low
    if high is not None:
        bounds["le"] = high
    return Annotated[float, BeforeValidator(_a_number), Bound(**bounds)]


def int_at_least(low: int) -> Any:
    return Annotated[StrictInt, Bound(ge=low)]


# FSDP's shard group size (verl's `fsdp_size`): -1, every rank of the role; else the ranks of each group.
shard_group_size = Union[Literal[-1], Annotated[StrictInt, Bound(ge=1)]]
any_int = StrictInt  # negative ones included (verl's `lr_warmup_steps=-1` means "use the ratio")
boolean = StrictBool
non_empty_str = Annotated[StrictStr, Bound(min_length=1)]


def optional(inner: Any) -> Any:
    return Optional[inner]


def one_of(*choices: Any) -> Any:
    """One of `choices` (a registry's names: the list lives where the names are implemented)."""
    return Literal[choices]


token_ids = Union[int_at_least(0), Annotated[list[int_at_least(0)], Bound(min_length=1)]]
betas = Annotated[list[float_in(0.0, 1.0)], Bound(min_length=2, max_length=2)]
module_names = Union[non_empty_str, Annotated[list[non_empty_str], Bound(min_length=1)]]


def _tool_spec(value: str) -> str:
    if ":" not in value:
        raise ValueError("not 'path/to/file.py:function'")
    return value


spec_list = list[Annotated[StrictStr, AfterValidator(_tool_spec)]]
# A model's `override_config`: config.json field names (strings) to values.
config_fields = dict[non_empty_str, Any]


def _engine_kwargs(value: Any) -> dict[str, Any]:
    """verl's `rollout.engine_kwargs`: {vllm: {name: value}}; the names are checked against vLLM where it runs."""
    if not isinstance(value, Mapping) or set(value) - {"vllm"} or not isinstance(value.get("vllm") or {}, Mapping):
        raise ValueError("not {vllm: {argument: value}}")
    return {"vllm": dict(value.get("vllm") or {})}


engine_kwargs_mapping = Annotated[Any, AfterValidator(_engine_kwargs)]
