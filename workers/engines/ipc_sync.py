"""Driver side of the CUDA IPC weight sync between a train engine and inference engines on the same GPUs.

Each train rank that shares its GPU with inference workers allocates two staging buffers once and hands
their IPC handles to those workers, which map them once. A sync then has every train rank export the full
weights (the FSDP gathers are collective) while each feeding rank packs bucket after bucket into its buffers
and has its engines load each bucket in place: one device-local copy per byte, no NCCL group on one GPU.
"""

from __future__ import annotations

from typing import Any

from workers.rollout.verify import verify_engines


class IpcEngineSync:
    def __init__(self, train: Any, infer: Any, feeding_rank: tuple[int, ...], vocab_size: int, verify: bool,
                 tolerance: float | None) -> None:
        self.train, self.infer, self.feeding_rank = train, infer, feeding_rank
        self.vocab_size, self.verify, self.tolerance = vocab_size, verify, tolerance
        self.layouts: list | None = None

    def _connect(self) -> None:
        self.layouts = self.train.weight_sync_layouts()
        handles = self.train.open_ipc_staging(self.layouts, sorted(set(self.feeding_rank)))
        self.infer.open_ipc_buffers([handles[rank] for rank in self.feeding_rank])

    def sync(self, version: int | None = None) -> dict[str, float]:
        """Send the weights; `version` (the trainer's weights version, if it keeps one) goes to the engines."""
        if self.layouts is None:
            self._connect()
        workers = self.infer.workers
        targets = [[workers[i] for i, rank in enumerate(self.feeding_rank) if rank == train_rank]
                   for train_rank in range(self.train.world_size)]
        metrics = self.train.send_ipc(self.layouts, targets)[0]
        self.infer.finish_weight_load(version)
        if self.verify:
            trainer = self.train.probe_log_probs()[0]
            engines = self.infer.probe_log_probs(self.vocab_size)
            metrics.update(
                verify_engines(trainer, engines, self.layouts[0].slots[0].dtype, self.tolerance, "CUDA IPC weight sync")
            )
        return metrics
