"""Auto-padding switch for `DataProto.chunk`: per DataProto (a meta_info flag) or for the whole process.

Dispatching to a worker group always pads a DataProto whose length does not divide the group (and strips
the padding from the outputs), whatever this switch says. The switch only changes `DataProto.chunk`: with
padding enabled it splits an uneven length into near-equal chunks instead of raising.
"""

from __future__ import annotations

from protocol.errors import ProtocolTypeError

# The meta_info key `DataProto.from_dict(..., auto_padding=True)` sets on the DataProto it builds.
AUTO_PADDING_KEY = "_auto_padding"


class _ConfigType(type):
    _auto_padding = False

    @property
    def auto_padding(cls) -> bool:
        return cls._auto_padding

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise ProtocolTypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._auto_padding = enabled


class DataProtoConfig(metaclass=_ConfigType):
    """Process-wide DataProto settings: `DataProtoConfig.auto_padding = True` enables auto-padding for all."""

    auto_padding_key = AUTO_PADDING_KEY


__all__ = ["AUTO_PADDING_KEY", "DataProtoConfig"]
