"""Moving an optimizer's state (Adam moments; step counts stay put) between the device and host memory.

Works for torch optimizers (plain or FSDP2 DTensor state) and Megatron's (chained) optimizers, whose
torch optimizer sits under `.optimizer`. The storages move and the tensors stay (the same mechanism as the
FSDP workers' offload, workers/fsdp/storage_offload.py: host buffers allocated once, page-locked on a GPU),
so a round trip returns bit-identical state in the same tensor objects. On CPU the round trip is real too
(host buffers of plain memory), which is what the CPU tests check.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.fsdp.offload import optimizer_state_tensors
from workers.fsdp.storage_offload import StorageOffloader


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    parts = chained if chained is not None else [optimizer]
    inner = [getattr(part, "optimizer", None) for part in parts]
    if not all(isinstance(opt, torch.optim.Optimizer) for opt in inner):
        raise TypeError(f"cannot find the torch optimizer(s) holding the state of {type(optimizer).__name__}")
    return inner


class OptimizerStateOffload:
    """One optimizer's state, offloaded to and loaded from its own host buffers."""

    def __init__(self, optimizer: Any, device: torch.device) -> None:
        optimizers = torch_optimizers(optimizer)
        self.device = device
        self.storages = StorageOffloader(lambda: optimizer_state_tensors(optimizers), device)

    def offload(self) -> None:
        self.storages.offload()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # return the freed device memory (e.g. to the inference engine)

    def load(self) -> None:
        self.storages.load()
