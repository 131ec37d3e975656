"""`MegatronSide`: what the Megatron actor and critic sides share. Both train over Megatron's TP x PP x DP groups
and move their trained model's state by one `Residency` (workers/fsdp/residency.py) over `MegatronOffloader`s
(workers/megatron/offload.py: verl's `megatron.param_offload` / `grad_offload` / `optimizer_offload`), which the
residency hooks (workers/training/side.py) call."""

from __future__ import annotations

from typing import Any

from workers.fsdp.residency import ResidencyHooks
from workers.megatron.backend import MegatronBackend
from workers.megatron.model import ParallelSettings
from workers.megatron.offload import MegatronOffloader
from workers.megatron.parallel import init_megatron_parallel


class MegatronSide(ResidencyHooks):
    sequence_parallel = 1  # no Ulysses: a row is on one rank

    def init_parallel(self, worker: Any, megatron_cfg: dict[str, Any]) -> ParallelSettings:
        """Megatron's groups over the worker group (workers/megatron/parallel.py); the settings they follow."""
        settings = ParallelSettings.from_config(megatron_cfg)
        self.data_parallel_size = init_megatron_parallel(
            worker, settings.tp, settings.pp, settings.ep, settings.etp
        ).dp_size
        return settings

    def where(self, role: str) -> str:
        return f"{role} (over data-parallel ranks)"


def trained_offloader(backend: MegatronBackend, megatron_cfg: dict[str, Any]) -> MegatronOffloader:
    """The offloader of a trained model under its role's `megatron` switches."""
    return MegatronOffloader(
        backend, megatron_cfg["param_offload"], megatron_cfg["grad_offload"], megatron_cfg["optimizer_offload"]
    )
