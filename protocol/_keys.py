"""Key normalisation and "missing key" errors shared by the DataProto operations."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Union

# A batch key is a plain string or, for nested TensorDicts, a tuple of strings.
BatchKey = Union[str, tuple[str, ...]]


class MissingKeyError(KeyError, AssertionError):
    """KeyError whose str() is the readable message (plain KeyError quotes it); also an AssertionError
    (see errors.py)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def as_key_list(keys: str | tuple[str, ...] | Iterable[BatchKey] | None) -> list[BatchKey] | None:
    """Accept one key or a collection of keys; None stays None (meaning "all")."""
    if keys is None:
        return None
    if isinstance(keys, (str, tuple)):
        return [keys]
    return list(keys)


def normalize_batch_key(key: BatchKey) -> BatchKey:
    """("a",) and "a" name the same leaf; use the string form for one-element tuples."""
    if isinstance(key, tuple) and len(key) == 1:
        return key[0]
    return key


def format_key(key: BatchKey) -> str:
    """Render nested keys as a.b for messages and reprs."""
    return ".".join(key) if isinstance(key, tuple) else key


def require_keys(kind: str, wanted: Sequence[BatchKey], available: Iterable[BatchKey]) -> None:
    """Raise one MissingKeyError listing every missing key and what is available."""
    available_list = list(available)
    present = set(available_list)
    missing = [k for k in wanted if k not in present]
    if missing:
        names = [format_key(k) for k in missing]
        have = sorted(format_key(k) for k in available_list)
        raise MissingKeyError(f"{kind} key(s) {names} not found; available {kind} keys: {have}")
