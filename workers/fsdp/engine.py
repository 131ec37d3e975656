"""`FSDPEngine`: one FSDP2-sharded HF model with (optionally) its optimizer, LR schedule and checkpoints.

The actor, the reference policy, the critic and the reward model are each one engine; the workers add
what is specific to their role (losses, generation, output keys).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workers.fsdp import checkpoint
from workers.fsdp.model_loading import compute_dtype, load_sharded_model, worker_device
from workers.fsdp.optim import build_lr_scheduler, build_optimizer, clip_gradients


class FSDPEngine:
    """Build after the process group exists, e.g. `FSDPEngine(AutoModelForCausalLM, cfg["model"], rank,
    optim_cfg=cfg["actor"]["optim"])`. With `optim_cfg=None` the model is frozen: no optimizer, loaded
    directly in the compute dtype.
    """

    def __init__(
        self,
        auto_class: Any,
        model_cfg: dict[str, Any],
        rank: int,
        optim_cfg: dict[str, Any] | None = None,
        config_overrides: dict[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        self.auto_class = auto_class
        self.model_path: str = model_cfg["path"]
        self.rank = rank
        self.device = worker_device()
        self.dtype = compute_dtype(model_cfg["dtype"], self.device)
        self.trainable = optim_cfg is not None
        self.module: nn.Module = load_sharded_model(
            auto_class, model_cfg, self.device, self.trainable, config_overrides, seed
        )
        self.optimizer = build_optimizer(self.module, optim_cfg) if optim_cfg is not None else None
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_cfg) if self.optimizer is not None else None

    # ---- training -------------------------------------------------------------------------------------
    def _require_trainable(self, what: str) -> None:
        if self.optimizer is None:
            raise RuntimeError(f"{what} needs a trainable model; this engine was built frozen (no optimizer)")

    def zero_grad(self) -> None:
        self._require_trainable("zero_grad")
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self, grad_clip: float) -> float:
        """Clip and step; a non-finite gradient norm skips the step (same on every rank: the norm is global)."""
        self._require_trainable("optimizer_step")
        grad_norm = clip_gradients(self.module, grad_clip)
        if torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def current_lr(self) -> float:
        self._require_trainable("current_lr")
        return float(self.lr_scheduler.get_last_lr()[0])

    def lr_scheduler_step(self) -> None:
        self._require_trainable("lr_scheduler_step")
        self.lr_scheduler.step()

    # ---- checkpoints ----------------------------------------------------------------------------------
    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        self._require_trainable("save_checkpoint")
        state = {"lr_scheduler": self.lr_scheduler.state_dict(), **(extra or {})}
        checkpoint.save_sharded(path, self.module, self.optimizer, state, self.rank)

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore everything `save_checkpoint` wrote; returns the caller's `extra` entries."""
        self._require_trainable("load_checkpoint")
        extra = checkpoint.load_sharded(path, self.module, self.optimizer, self.rank)
        self.lr_scheduler.load_state_dict(extra.pop("lr_scheduler"))
        return extra

    def export_hf(self, path: str) -> None:
        checkpoint.export_hf(self.module, self.auto_class, path, self.model_path, self.rank)
