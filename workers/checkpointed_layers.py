"""Which decoder layers keep their activations under `model.gradient_checkpointing_layers` (torch-free: the
memory plan reads it before any worker starts)."""

from __future__ import annotations


def kept_layers(recompute_layers: int | None, layers: int) -> int:
    """The last decoder layers that keep their activations when the first `recompute_layers` recompute in
    backward (None: every layer recomputes, none kept). A count above `layers` is refused with the valid range."""
    if recompute_layers is None:
        return 0
    if recompute_layers > layers:
        raise ValueError(
            f"gradient_checkpointing_layers={recompute_layers}, but the model has {layers} decoder layers; "
            f"valid: 1 to {layers}, or null for all of them"
        )
    return layers - recompute_layers
