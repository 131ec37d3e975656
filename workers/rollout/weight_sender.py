"""The trainer side of broadcast weight sync, as worker methods of the actor (mixed into its worker class).

The driver (`workers/rollout/separate_sync.py`) asks rank 0 to host the group's store, connects rank 0
and every engine worker at once, then per sync calls `broadcast_weights` on every actor rank (all take
part in the gathers: FSDP's, or Megatron's TP gathers and PP broadcasts; rank 0 sends) while the engines receive.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from single_controller import Dispatch, register
from workers.rollout.buckets import BucketLayout, payload_bytes
from workers.rollout.sync_group import SyncGroupAddress, WeightSyncGroup
from workers.rollout.verify import TRAINER_FINGERPRINT, WeightFingerprint, probe_sequences
from workers.rollout.weight_sync import (
    BroadcastSender,
    IpcStagingBuffers,
    WeightBuckets,
    send_broadcast,
    send_ipc_to_engines,
)

GIB = float(1 << 30)


class SendSource(Protocol):
    """What the sends read of the trainer's weights: a `WeightSource` (workers/rollout/in_process_sync.py, FSDP's
    or Megatron's) has it all, and `weight_sync_layouts` also asks it for `sync_layouts` and its dtype."""

    device: torch.device
    vocab_size: int

    def buckets(self, layouts: list[BucketLayout], cast: bool = True) -> WeightBuckets: ...

    def probe_log_probs(self, probe: torch.Tensor) -> torch.Tensor: ...


class WeightSenderMixin:
    """Needs `self.rank`, `self.config` and `self._sync_source()`, which returns the trainer's weights (a
    `SendSource`), their parameters on the device. The engine API's module worker plans its own layouts
    (`weight_sync_layouts`)."""

    rank: int
    config: dict[str, Any]

    def _sync_source(self) -> SendSource:
        raise NotImplementedError(f"{type(self).__name__} must say which weights it sends (_sync_source)")
    _sync_group: WeightSyncGroup | None = None  # rank 0's broadcast group with the engines
    _broadcast_sender: BroadcastSender | None = None  # rank 0's staging buffers, kept between syncs

    @register(Dispatch.RANK_ZERO)
    def host_weight_sync(self, world_size: int, backend: str) -> SyncGroupAddress:
        self._sync_group = WeightSyncGroup()
        return self._sync_group.host_store(world_size, backend)

    @register(Dispatch.RANK_ZERO)
    def connect_weight_sync(self, address: SyncGroupAddress) -> None:
        """Rank 0 joins as group rank 0; returns once every engine worker has joined too."""
        self._sync_group.connect(address, 0)

    @register(Dispatch.RANK_ZERO)
    def weight_sync_layouts(self) -> list[BucketLayout]:
        """The bucket plan (names, shapes, engine dtype) both sides follow; with LoRA, the adapter factors only."""
        from workers.rollout.hybrid import engine_dtype

        source = self._sync_source()
        bucket_bytes = self.config["rollout"]["weight_sync_bucket_mb"] << 20
        return source.sync_layouts(engine_dtype(self.config["rollout"], source), bucket_bytes)

    @register(Dispatch.ONE_TO_ALL)
    def broadcast_weights(self, layouts: list[BucketLayout], fingerprint: bool = False) -> dict[str, float]:
        """Every rank gathers, rank 0 sends (its staging buffers are kept for the next sync). With
        `fingerprint`, rank 0 also returns the `WeightFingerprint` of what it sent."""
        source = self._sync_source()
        start = time.perf_counter()
        if self.rank == 0 and self._broadcast_sender is None:
            self._broadcast_sender = BroadcastSender(source.device)
        taken = WeightFingerprint() if fingerprint and self.rank == 0 else None
        sent = send_broadcast(
            source.buckets(layouts, cast=False), self._sync_group if self.rank == 0 else None,
            source.device, sender=self._broadcast_sender, fingerprint=taken,
        )
        metrics = {
            "rollout/sync_s": time.perf_counter() - start,
            "rollout/sync_gib": sent / GIB,
            "rollout/sync_bytes": float(payload_bytes(layouts)) if sent else 0.0,  # rank 0 sends, the others gather
        }
        return metrics if taken is None else {**metrics, TRAINER_FINGERPRINT: taken.value}

    # ---- CUDA IPC (separate engines on this rank's GPU: fractional GPU shares) ------------------------------
    _ipc_staging: IpcStagingBuffers | None = None

    @register(Dispatch.ONE_TO_ALL)
    def open_ipc_staging(self, layouts: list[BucketLayout], feeding_ranks: list[int]) -> Any:
        """Ranks in `feeding_ranks` allocate their two staging buffers once and return their IPC handles."""
        if self.rank not in feeding_ranks:
            return None
        self._ipc_staging = IpcStagingBuffers(layouts, self._sync_source().device)
        return self._ipc_staging.handles

    @register(Dispatch.ONE_TO_ALL)
    def send_ipc(self, layouts: list[BucketLayout], targets: list[list[Any]]) -> dict[str, float]:
        """Every rank gathers; a rank sharing its GPU with engines (`targets[rank]`, their actor handles)
        packs each bucket and has them load it in place."""
        start = time.perf_counter()
        buckets = self._sync_source().buckets(layouts, cast=False)
        sent = send_ipc_to_engines(self._ipc_staging, buckets, targets[self.rank])
        return {"rollout/sync_s": time.perf_counter() - start, "rollout/sync_gib": sent / GIB}

    @register(Dispatch.ONE_TO_ALL)
    def weights_fingerprint(self, layouts: list[BucketLayout]) -> float:
        """`WeightFingerprint` of the weights as a sync would send them (engine dtype); a collective."""
        taken = WeightFingerprint()
        for _, tensors in self._sync_source().buckets(layouts):
            taken.add(tensors)
        return taken.value

    @register(Dispatch.ONE_TO_ALL)
    def probe_log_probs(self) -> torch.Tensor:
        """The trainer's log-probs of the probe batch (compared with each engine's after a sync); every
        rank runs the forward (a collective), each returns the same values."""
        source = self._sync_source()
        return source.probe_log_probs(probe_sequences(source.vocab_size))
