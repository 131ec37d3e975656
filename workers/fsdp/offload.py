"""Moving a trainer's parameters and optimizer state between the GPU and host memory, and counting the moves.

An `Offloader` keeps track of where one model's parameters (with their gradients and buffers) and its
optimizer's state are, and moves them with `StorageOffloader` (workers/fsdp/storage_offload.py). When to
move is the caller's policy (workers/fsdp/residency.py).

On CPU nothing moves (the host is the device), but every requested move is still counted, so the policy
can be checked there; `move_on_cpu=True` (tests, the benchmark's CPU check) makes the moves real.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from workers.fsdp.storage_offload import StorageFilter, StorageOffloader, Transfer

GIB = float(1 << 30)


def module_state_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    """Parameters, their gradients (if any) and buffers. FSDP2 units are resharded first, so the parameters
    are the sharded ones (a root's forward leaves its unsharded compute copies registered)."""
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()
    for param in module.parameters():
        yield param
        if param.grad is not None:
            yield param.grad
    yield from module.buffers()


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers holding `optimizer`'s state: itself, or those under Megatron's (chained) optimizers'
    `.optimizer`."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    inner = [getattr(part, "optimizer", None) for part in (chained if chained is not None else [optimizer])]
    if not all(isinstance(opt, torch.optim.Optimizer) for opt in inner):
        raise TypeError(f"cannot find the torch optimizer(s) holding the state of {type(optimizer).__name__}")
    return inner


def optimizer_state_tensors(optimizers: list[Any]) -> Iterator[torch.Tensor]:
    """Every tensor in the optimizers' per-parameter state (AdamW: exp_avg, exp_avg_sq, step); torch optimizers or
    Megatron's."""
    for optimizer in (opt for outer in optimizers for opt in torch_optimizers(outer)):
        for state in optimizer.state.values():
            yield from (value for value in state.values() if isinstance(value, torch.Tensor))


class TrackedState:
    """One kind of a model's state (its parameters, its optimizer's state, Megatron's gradient buffers): whether it
    is on the device, moved on request when it `may_leave` (on CPU only counted, unless `moves_bytes`), and how many
    changes of place were asked for."""

    def __init__(self, storages: StorageOffloader, may_leave: bool, moves_bytes: bool, device: torch.device) -> None:
        self.storages, self.may_leave, self.moves_bytes, self.device = storages, may_leave, moves_bytes, device
        self.on_device = True
        self.moves = 0  # requested changes of place, also where nothing moves (CPU)

    def load(self) -> None:
        if not self.on_device:
            if self.moves_bytes:
                self.storages.load()
            self.on_device = True
            self.moves += 1

    def offload(self) -> None:
        if self.may_leave and self.on_device:
            if self.moves_bytes:
                self.storages.offload()
                if self.device.type == "cuda":  # freed storages go back to PyTorch's cache: hand them to vLLM
                    torch.cuda.empty_cache()
            self.on_device = False
            self.moves += 1


class Offloader:
    """Where one model's parameters and its optimizer's state are (`params_on_device`,
    `optimizer_on_device`), moved on request. `param_offload` / `optimizer_offload` say what may leave
    the device at all; `frozen` (a reference model) keeps the first host copy of the parameters, so later
    offloads only free the device memory; `params_stay` names parameter storages that never move (a LoRA
    actor's base shared with its engine). Without a `module` only the optimizer's state moves (the strategy API's
    offload: a torch optimizer, or Megatron's)."""

    def __init__(
        self,
        module: nn.Module | None,
        optimizer: Any,
        device: torch.device,
        param_offload: bool,
        optimizer_offload: bool,
        frozen: bool = False,
        move_on_cpu: bool = False,
        params_stay: StorageFilter | None = None,
    ) -> None:
        self.module, self.optimizer, self.device = module, optimizer, device
        self.param_offload = param_offload
        self.optimizer_offload = optimizer_offload and optimizer is not None
        moves_bytes = device.type == "cuda" or move_on_cpu
        self.params = StorageOffloader(self.param_tensors, device, frozen=frozen, stays=params_stay)
        self.optimizer_state = StorageOffloader(self.optimizer_tensors, device)
        self._params = TrackedState(self.params, param_offload, moves_bytes, device)
        self._optimizer = TrackedState(self.optimizer_state, self.optimizer_offload, moves_bytes, device)
        self._states = [self._params, self._optimizer]  # a subclass adds the kinds it moves besides
        self._step_hooks: list[Any] = []
        self._optimizer_holds = 0  # open `optimizer_held` blocks: the optimizer's state does not leave

    # ---- what moves (asked at each move: an optimizer's lazily created state is followed) ----------------
    def param_tensors(self) -> Iterator[torch.Tensor]:
        return module_state_tensors(self.module)

    def optimizer_tensors(self) -> Iterator[torch.Tensor]:
        return optimizer_state_tensors([self.optimizer] if self.optimizer is not None else [])

    # ---- moves ----------------------------------------------------------------------------------------
    @property
    def moves_bytes(self) -> bool:
        """Moves copy bytes (on a GPU, or on CPU when asked); otherwise they are only counted."""
        return self._params.moves_bytes

    @moves_bytes.setter
    def moves_bytes(self, value: bool) -> None:
        for state in self._states:
            state.moves_bytes = value

    @property
    def params_on_device(self) -> bool:
        return self._params.on_device

    @property
    def optimizer_on_device(self) -> bool:
        return self._optimizer.on_device

    @property
    def param_moves(self) -> int:
        return self._params.moves

    @property
    def optimizer_moves(self) -> int:
        return self._optimizer.moves

    def load_params(self) -> None:
        self._params.load()

    def offload_params(self) -> None:
        self._params.offload()

    def load_optimizer(self) -> None:
        self._optimizer.load()

    def offload_optimizer(self) -> None:
        if not self._optimizer_holds:
            self._optimizer.offload()

    def load(self, with_optimizer: bool = False) -> None:
        """Bring what the next computation needs onto the device."""
        self.load_params()
        if with_optimizer:
            self.load_optimizer()

    def offload(self) -> None:
        """Move everything configured to be offloaded to the host."""
        self.offload_params()
        self.offload_optimizer()

    @contextlib.contextmanager
    def optimizer_held(self) -> Iterator[None]:
        """The optimizer's state stays on the device inside the block, whatever steps run there. A checkpoint
        load needs this: torch's state-dict helpers create a missing AdamW state with a zero-gradient step,
        whose post-step hook would move that state to the host (its storages emptied) right before the
        checkpoint's values are copied into it (a CUDA "invalid argument" on a GPU, a crash on CPU)."""
        self._optimizer_holds += 1
        try:
            yield
        finally:
            self._optimizer_holds -= 1

    def optimizer_only_in_steps(self) -> None:
        """With `optimizer_offload`, the optimizer's state comes to the device right before each
        `optimizer.step()` and leaves right after it (hooks on the optimizer): forward and backward run
        without it. AdamW creates its state in its first step; the first offload follows it."""
        if not self.optimizer_offload or self._step_hooks:
            return
        self._step_hooks = [
            self.optimizer.register_step_pre_hook(lambda *_: self.load_optimizer()),
            self.optimizer.register_step_post_hook(lambda *_: self.offload_optimizer()),
        ]

    # ---- accounting -----------------------------------------------------------------------------------
    @property
    def offloads(self) -> bool:
        """Anything is configured to leave the device."""
        return self.param_offload or self.optimizer_offload

    def move_counts(self) -> dict[str, int]:
        """Requested changes of place so far, by kind of state."""
        return {"params": self.param_moves, "optimizer": self.optimizer_moves}

    @property
    def host_allocations(self) -> int:
        return self.params.host_allocations + self.optimizer_state.host_allocations

    @property
    def host_bytes(self) -> int:
        return self.params.host_bytes + self.optimizer_state.host_bytes

    def take_transfer(self) -> Transfer:
        """Bytes moved and time spent since the last call (parameters and optimizer state together)."""
        taken = self.params.take_transfer()
        taken.add(self.optimizer_state.take_transfer())
        return taken


def transfer_metrics(phase: str, transfer: Transfer, moves: dict[str, int]) -> dict[str, float]:
    """`offload/<phase>/...`: GiB each way, seconds spent moving (a first offload's host allocation
    included, and also reported alone), and the moves each offloader was asked for (`moves`: e.g.
    {"actor_params": 1}; counted on CPU too, where nothing moves)."""
    metrics = {
        f"offload/{phase}/h2d_gib": transfer.h2d_bytes / GIB,
        f"offload/{phase}/d2h_gib": transfer.d2h_bytes / GIB,
        f"offload/{phase}/seconds": transfer.seconds,
    }
    if transfer.host_alloc_s:
        metrics[f"offload/{phase}/host_alloc_s"] = transfer.host_alloc_s
    metrics.update({f"offload/{phase}/{name}_moves": float(count) for name, count in moves.items()})
    return metrics
