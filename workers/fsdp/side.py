"""`FSDPSide`: what the FSDP actor and critic sides share. Both lay their ranks out in data-parallel groups of
Ulysses ranks (workers/fsdp/ulysses.py) and move their trained model's state by one `Residency`
(workers/fsdp/residency.py), which the residency hooks (workers/training/side.py) call."""

from __future__ import annotations

from workers.fsdp.residency import ResidencyHooks
from workers.fsdp.ulysses import SequenceLayout


class FSDPSide(ResidencyHooks):
    layout: SequenceLayout

    @property
    def sequence_parallel(self) -> int:
        return self.layout.size

    @property
    def data_parallel_size(self) -> int:
        return self.layout.dp_size

    def where(self, role: str) -> str:
        return self.layout.where(role)
