"""Moving a Megatron model's state between the GPU and host memory (verl's `megatron.param_offload`,
`grad_offload` and `optimizer_offload`), with the FSDP workers' `Offloader` under their policy
(workers/fsdp/residency.py: state leaves when another tenant of the GPU, such as the hybrid engine, claims it).

What each switch moves, storage by storage (every parameter, view and optimizer reference stays the same object):
- param_offload: the compute-dtype weights (Megatron's DDP keeps them in contiguous buffers that the parameters
  are views of) and the module's buffers; they come back for every pass and weight sync;
- grad_offload: the float32 gradient buffers behind each parameter's `main_grad` (twice the bf16 weights); they
  leave with the weights and come back only for training, at the first `zero_grad` of an update;
- optimizer_offload: the optimizer's float32 main weights (the distributed optimizer's shards of them) and Adam's
  moments. Storages of the model's own weights or gradients are left to the two switches above (a float32
  model's optimizer steps the parameters themselves).
Megatron's optimizer step copies the gradient buffers into the main weights' gradients and the stepped main
weights back into the model around its inner Adam step, so its state is on the device for the whole
`MegatronBackend.optimizer_step` (the backend's hooks), not only the inner step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from workers.fsdp.offload import Offloader, TrackedState, torch_optimizers
from workers.fsdp.storage_offload import StorageOffloader, Transfer

if TYPE_CHECKING:
    from workers.megatron.backend import MegatronBackend


class MegatronOffloader(Offloader):
    def __init__(
        self,
        backend: MegatronBackend,
        param_offload: bool,
        grad_offload: bool = False,
        optimizer_offload: bool = False,
        frozen: bool = False,
        move_on_cpu: bool = False,
    ) -> None:
        self.backend = backend
        super().__init__(
            backend.model, backend.optimizer, backend.device, param_offload, optimizer_offload, frozen=frozen,
            move_on_cpu=move_on_cpu,
        )
        self.grad_offload = grad_offload and backend.optimizer is not None
        self.grads = StorageOffloader(self._gradient_buffers, backend.device)
        self._grads = TrackedState(self.grads, self.grad_offload, self.moves_bytes, backend.device)
        self._states.append(self._grads)
        if self.grad_offload:
            backend.add_hooks(before_zero_grad=self.load_grads)

    # ---- what moves -----------------------------------------------------------------------------------
    def _gradient_buffers(self) -> Iterator[torch.Tensor]:
        for param in self.module.parameters():
            main_grad = getattr(param, "main_grad", None)  # Megatron's DDP: a view of its float32 buffer
            if main_grad is not None:
                yield main_grad

    def param_tensors(self) -> Iterator[torch.Tensor]:
        yield from self.module.parameters()
        # Megatron's DDP names its gradient buffers `buffers`, hiding nn.Module's method: call that one.
        yield from nn.Module.buffers(self.module)

    def optimizer_tensors(self) -> Iterator[torch.Tensor]:
        """The optimizer's own storages: its main weights and per-parameter state, less the model's weights and
        gradient buffers (a main weight or its gradient may be a view of them)."""
        model = [*self.module.parameters(), *self._gradient_buffers()]
        model_storages = {t.untyped_storage().data_ptr() for t in model}
        for optimizer in torch_optimizers(self.optimizer):
            owned = [p for group in optimizer.param_groups for p in group["params"]]
            owned += [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
            yield from (t for t in owned if t.untyped_storage().data_ptr() not in model_storages)

    # ---- moves ----------------------------------------------------------------------------------------
    def offload_params(self) -> None:
        """Another tenant claims the device: the weights and the gradient buffers leave (each if configured)."""
        super().offload_params()
        self._grads.offload()

    def load_grads(self) -> None:
        self._grads.load()

    def optimizer_only_in_steps(self) -> None:
        """With `optimizer_offload`, the optimizer's state is on the device inside each `optimizer_step` only."""
        if not self.optimizer_offload or self._step_hooks:
            return
        self._step_hooks = [self.backend.add_hooks(before_step=self.load_optimizer, after_step=self.offload_optimizer)]

    # ---- accounting -----------------------------------------------------------------------------------
    @property
    def offloads(self) -> bool:
        return super().offloads or self.grad_offload

    def move_counts(self) -> dict[str, int]:
        return {**super().move_counts(), "grads": self._grads.moves}

    @property
    def host_allocations(self) -> int:
        return super().host_allocations + self.grads.host_allocations

    @property
    def host_bytes(self) -> int:
        return super().host_bytes + self.grads.host_bytes

    def take_transfer(self) -> Transfer:
        taken = super().take_transfer()
        taken.add(self.grads.take_transfer())
        return taken
