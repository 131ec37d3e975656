"""Errors raised by DataProto's input checks.

Each is also an `AssertionError`: code ported from a library whose checks are `assert` statements keeps
catching them with `except AssertionError`, while new code catches the precise `ValueError` / `TypeError`.
"""

from __future__ import annotations


class ProtocolValueError(ValueError, AssertionError):
    """A DataProto operation got a value it cannot use (length, key, shape, conflicting content)."""


class ProtocolTypeError(TypeError, AssertionError):
    """A DataProto operation got an argument of the wrong kind."""


__all__ = ["ProtocolTypeError", "ProtocolValueError"]
