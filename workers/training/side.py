"""`TrainedSide`: what the actor and critic workers ask of their backend's side about the model they train: its
data-parallel layout, and where its state lives between phases (FSDP may offload it to the host; Megatron's
stays on the device)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol


class TrainedSide(Protocol):
    sequence_parallel: int  # ranks sharing each row (Ulysses): token budgets are per GPU
    data_parallel_size: int

    def where(self, role: str) -> str:
        """How a batch-size error names the ranks a global mini-batch is split over."""
        ...

    def trained_needed(self, with_optimizer: bool = False) -> None:
        """The trained model's parameters (and optimizer state if asked) on the device for the next phase; a
        colocated role's offloadable state leaves first."""
        ...

    def optimizer_held(self) -> AbstractContextManager[None]:
        """Keep the optimizer state on the device for the block (a checkpoint reads or writes it)."""
        ...

    def end_phase(self, phase: str) -> dict[str, float]:
        """The phase is over: its offload metrics ({} when nothing moves)."""
        ...
