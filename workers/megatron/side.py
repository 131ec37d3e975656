"""`MegatronSide`: what the Megatron actor and critic sides share. Both train over Megatron's TP x PP x DP groups,
and their state stays on the device, so the residency hooks (workers/training/side.py) move nothing."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from workers.megatron.model import ParallelSettings
from workers.megatron.parallel import init_megatron_parallel


class MegatronSide:
    sequence_parallel = 1  # no Ulysses: a row is on one rank

    def init_parallel(self, worker: Any, megatron_cfg: dict[str, Any]) -> ParallelSettings:
        """Megatron's groups over the worker group (workers/megatron/parallel.py); the settings they follow."""
        settings = ParallelSettings.from_config(megatron_cfg)
        self.data_parallel_size = init_megatron_parallel(worker, settings.tp, settings.pp, settings.ep).dp_size
        return settings

    def where(self, role: str) -> str:
        return f"{role} (over data-parallel ranks)"

    def trained_needed(self, with_optimizer: bool = False) -> None:
        pass

    def optimizer_held(self) -> AbstractContextManager[None]:
        return nullcontext()

    def end_phase(self, phase: str) -> dict[str, float]:
        return {}
