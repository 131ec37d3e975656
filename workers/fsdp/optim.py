"""AdamW, the warmup + constant/cosine LR schedule, and gradient clipping over sharded parameters."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR


def build_optimizer(model: nn.Module, optim_cfg: dict[str, Any]) -> torch.optim.AdamW:
    """AdamW over the trainable parameters. On CUDA the fused kernel: the default multi-tensor ("foreach")
    step makes a float32 temporary the size of the parameters (28 GiB at 7B), which decides whether a
    full fine-tune fits one GPU; on CPU the default, whose results the CPU tests pin."""
    params = [p for p in model.parameters() if p.requires_grad]
    on_cuda = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(
        params,
        lr=optim_cfg["lr"],
        betas=tuple(optim_cfg["betas"]),
        eps=optim_cfg["eps"],
        weight_decay=optim_cfg["weight_decay"],
        **({"fused": True} if on_cuda else {}),
    )


def warmup_steps(optim_cfg: dict[str, Any]) -> int:
    """verl's rule: `lr_warmup_steps` when > 0, else int(`lr_warmup_steps_ratio` x `total_training_steps`)."""
    steps = optim_cfg["lr_warmup_steps"]
    if steps is not None and steps > 0:
        return int(steps)
    ratio = optim_cfg["lr_warmup_steps_ratio"]
    if not ratio:
        return 0
    total = optim_cfg["total_training_steps"]
    if total is None:
        raise ValueError(
            f"optim.lr_warmup_steps_ratio={ratio} needs optim.total_training_steps (the trainer sets it); "
            "or give optim.lr_warmup_steps > 0"
        )
    return int(ratio * total)


def lr_factor_fn(optim_cfg: dict[str, Any]) -> Callable[[int], float]:
    """Multiplier of the base lr at scheduler step `step` (0 = first optimizer call).

    Warmup (`warmup_steps` above) ramps linearly to 1, starting at 1/warmup so the first update is not wasted
    (verl's starts at 0); then the lr stays constant, or follows a cosine of `num_cycles` waves (0.5: from 1
    down to `min_lr_ratio` once) that ends at `total_training_steps`, never below `min_lr_ratio`.
    """
    warmup = warmup_steps(optim_cfg)
    kind = optim_cfg["lr_scheduler_type"]
    total = optim_cfg["total_training_steps"]
    floor = optim_cfg["min_lr_ratio"]
    cycles = optim_cfg.get("num_cycles", 0.5)
    if kind == "cosine" and total is None:
        raise ValueError("optim.lr_scheduler_type='cosine' needs optim.total_training_steps (the trainer sets it)")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(2.0 * math.pi * cycles * progress))

    return factor


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg: dict[str, Any]) -> LambdaLR:
    return LambdaLR(optimizer, lr_factor_fn(optim_cfg))


def clipped_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip the global gradient norm, step (skipped when the norm is not finite: the same on every rank, the norm
    is global) and zero the gradients; returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)
    grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # over all shards on all ranks
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
