"""`FSDPSide`: what the FSDP actor and critic sides share. Both lay their ranks out in data-parallel groups of
Ulysses ranks (workers/fsdp/ulysses.py) and move their trained model's state by one `Residency`
(workers/fsdp/residency.py), which the residency hooks (workers/training/side.py) call."""

from __future__ import annotations

from contextlib import AbstractContextManager

from workers.fsdp.offload import GIB
from workers.fsdp.residency import Residency
from workers.fsdp.ulysses import SequenceLayout


class FSDPSide:
    layout: SequenceLayout
    residency: Residency
    host_buffers_metric: str  # the metric of the host memory the offloaded state holds

    @property
    def sequence_parallel(self) -> int:
        return self.layout.size

    @property
    def data_parallel_size(self) -> int:
        return self.layout.dp_size

    def where(self, role: str) -> str:
        return self.layout.where(role)

    def trained_needed(self, with_optimizer: bool = False) -> None:
        self.residency.trained_needed(with_optimizer)

    def optimizer_held(self) -> AbstractContextManager[None]:
        return self.residency.optimizer_held()

    def end_phase(self, phase: str) -> dict[str, float]:
        """Nothing leaves the GPU here but optimizer state a checkpoint brought: the trained model's parameters
        stay until another tenant claims the device."""
        metrics = self.residency.end_phase(phase)
        if metrics:
            metrics[self.host_buffers_metric] = self.residency.host_bytes / GIB
        return metrics
