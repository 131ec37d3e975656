"""A pydantic model of each worker config section, built from its spec (workers/config.py: a `Field` per leaf key,
nested dicts for sections), and its errors in the config's own words: every wrong key at once, a line each,
named by its dotted key with what it accepts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from workers.config_fields import Field

_MODELS: dict[int, tuple[Mapping[str, Any], type[BaseModel]]] = {}


def section_model(spec: Mapping[str, Any], name: str = "WorkerConfig") -> type[BaseModel]:
    """The pydantic model of `spec` (cached per spec object): every key required, unknown keys refused."""
    cached = _MODELS.get(id(spec))
    if cached is not None and cached[0] is spec:
        return cached[1]
    fields: dict[str, Any] = {}
    for key, entry in spec.items():
        kind = section_model(entry, f"{name}_{key}") if isinstance(entry, Mapping) else entry.kind
        fields[key] = (kind, ...)
    model = create_model(name, __config__=ConfigDict(extra="forbid", protected_namespaces=()), **fields)
    _MODELS[id(spec)] = (spec, model)
    return model


def validated(spec: Mapping[str, Any], values: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """`values` checked and normalised by the section's model; ValueError listing every problem otherwise."""
    try:
        return section_model(spec).model_validate(values).model_dump()
    except ValidationError as error:
        raise ValueError("\n".join(_problems(spec, values, error, where))) from None


def _problems(spec: Mapping[str, Any], values: Mapping[str, Any], error: ValidationError, where: str) -> list[str]:
    unknown: dict[tuple[str, ...], list[str]] = {}
    lines: list[str] = []
    for item in error.errors():
        path, node = _spec_path(spec, [str(part) for part in item["loc"]])
        dotted = ".".join(filter(None, (where, *path)))
        if item["type"] == "extra_forbidden":
            unknown.setdefault(tuple(path), []).append(str(item["loc"][-1]))
        elif item["type"] == "missing":
            lines.append(f"config key {dotted!r} is required: {node.expected}")
        elif isinstance(node, Field):
            lines.append(f"config key {dotted!r} must be {node.expected}, got {_value_at(values, path)!r}")
        else:  # a section given something else than a mapping
            got = type(_value_at(values, path)).__name__
            lines.append(f"config section {dotted or '<root>'} must be a dict, got {got}")
    for path, keys in unknown.items():
        section = ".".join(filter(None, (where, *path)))
        place = f"in section {section!r}" if section else "at the top level"
        valid = sorted(_spec_path(spec, list(path))[1])
        lines.append(f"unknown config key(s) {sorted(keys)} {place}; valid keys: {valid}")
    return list(dict.fromkeys(lines))


def _spec_path(spec: Mapping[str, Any], loc: list[str]) -> tuple[list[str], Any]:
    """The part of an error's location that names spec keys, and the spec entry it ends at (a leaf's location
    may go on into its list items or union branches)."""
    node: Any = spec
    path: list[str] = []
    for part in loc:
        if not isinstance(node, Mapping) or part not in node:
            break
        node = node[part]
        path.append(part)
    return path, node


def _value_at(values: Any, path: list[str]) -> Any:
    for part in path:
        values = values.get(part) if isinstance(values, Mapping) else None
    return values
