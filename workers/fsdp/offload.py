"""Moving a trainer's parameters and optimizer state between the GPU and host memory.

Between the phases that need them (log-probs, update, weight sync) the actor's sharded parameters and
Adam moments can live on the host, leaving the GPU to the rollout engine. On CPU there is nothing to move.
"""

from __future__ import annotations

import torch
from torch import nn


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device != device:
                state[key] = value.to(device, non_blocking=True)


class Offloader:
    """Tracks where the module's parameters and the optimizer's state are, and moves them on request."""

    def __init__(self, module: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device,
                 param_offload: bool, optimizer_offload: bool) -> None:
        self.module, self.optimizer, self.device = module, optimizer, device
        active = device.type == "cuda"
        self.param_offload = param_offload and active
        self.optimizer_offload = optimizer_offload and active and optimizer is not None
        self.params_on_device = True
        self.optimizer_on_device = True

    def load(self, with_optimizer: bool = False) -> None:
        """Bring what the next phase needs onto the device."""
        if not self.params_on_device:
            self.module.to(self.device)  # FSDP2 moves the local shards and keeps the sharding
            self.params_on_device = True
        if with_optimizer and not self.optimizer_on_device:
            _move_optimizer_state(self.optimizer, self.device)
            self.optimizer_on_device = True
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def offload(self) -> None:
        """Move what is configured to be offloaded to the host and return the freed cache to the GPU."""
        moved = False
        if self.param_offload and self.params_on_device:
            self.module.to("cpu")
            self.params_on_device, moved = False, True
        if self.optimizer_offload and self.optimizer_on_device:
            _move_optimizer_state(self.optimizer, torch.device("cpu"))
            self.optimizer_on_device, moved = False, True
        if moved:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
