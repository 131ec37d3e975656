"""Moving an optimizer's state (Adam moments; step counters stay put) between the device and host memory.

Works for torch optimizers (plain or FSDP2 DTensor state) and Megatron's (chained) optimizers, whose
torch optimizer sits under `.optimizer`. Every state tensor is copied to new storage on the target and the
old one is dropped, so a round trip returns bit-identical state.
"""

from __future__ import annotations

from typing import Any

import torch


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    parts = chained if chained is not None else [optimizer]
    inner = [getattr(part, "optimizer", None) for part in parts]
    if not all(isinstance(opt, torch.optim.Optimizer) for opt in inner):
        raise TypeError(f"cannot find the torch optimizer(s) holding the state of {type(optimizer).__name__}")
    return inner


def move_optimizer_state(optimizer: Any, device: torch.device) -> None:
    for opt in torch_optimizers(optimizer):
        for state in opt.state.values():
            for key, value in state.items():
                # Scalars (Adam's step counts) stay where the optimizer keeps them: on the CPU.
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    state[key] = value.to(device, copy=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()  # return the freed device memory (e.g. to the inference engine)
