"""`model.use_liger` (verl's key): Liger's Triton kernels for the decoder's RMSNorm, SwiGLU MLP and rotary
embedding, patched into a loaded Hugging Face model before it is sharded.

Measured on one H200 (docs/benchmarks.md, benchmarks/update_profile.py): a 7B-shaped update spent 30% of its GPU
time in the unfused element-wise kernels of those three; with them fused the update went from 39% to 44% MFU.
The LM head stays ours (log-probs and entropy chunk by chunk, workers/head_log_probs.py), so Liger's fused
cross-entropy is left off. Liger patches the model type's module classes and rotary function process-wide, as
its own entry point does: models of that type built later in the same worker process get its kernels too.
"""

from __future__ import annotations

import torch
from torch import nn

INSTALL_HINT = 'pip install -e ".[liger]"'


def apply_liger_kernels(model: nn.Module, device: torch.device, key: str = "model.use_liger") -> None:
    """Patch `model` in place; ValueError naming `key` when the kernels cannot run here."""
    if device.type != "cuda":
        raise ValueError(f"{key}=true needs a CUDA GPU (Liger's kernels are Triton kernels); set it false on {device}")
    try:
        from liger_kernel.transformers.monkey_patch import (
            MODEL_TYPE_TO_APPLY_LIGER_FN,
            _apply_liger_kernel_to_instance,
        )
    except ImportError as error:
        raise ValueError(f"{key}=true needs the liger-kernel package ({INSTALL_HINT}): {error}") from None
    model_type = model.config.model_type
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ValueError(
            f"{key}=true: Liger has no kernels for model type {model_type!r}; "
            f"it has them for {sorted(MODEL_TYPE_TO_APPLY_LIGER_FN)}. Set it to false"
        )
    _apply_liger_kernel_to_instance(
        model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False
    )
