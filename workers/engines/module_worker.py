"""`ModuleWorker`: runs a user's `TrainModule` as one rank of a train engine.

Any public method of the module is called through `call_module` (NeedParallel arguments split by the
dispatcher, others sent whole). Weight export for the inference engine goes through the module's
`postprocess_output_named_parameters` hook, so e.g. a LoRA model sends merged base weights.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from single_controller import Dispatch, Worker, register
from workers.engines.materialize import materialize
from workers.fsdp.model_loading import compute_dtype, worker_device
from workers.fsdp.offload import Offloader
from workers.rollout.buckets import BucketLayout, plan_buckets
from workers.rollout.verify import TRAINER_FINGERPRINT, WeightFingerprint, probe_sequences, trainer_log_probs
from workers.rollout.weight_sender import SyncGroupHostMixin
from workers.rollout.weight_sync import IpcStagingBuffers, send_broadcast, send_ipc_to_engines
from workers.vision.models import probe_vocab_size

GIB = float(1 << 30)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


class ModuleWorker(SyncGroupHostMixin, Worker):
    def __init__(self, sync_dtype: str = "auto", bucket_mb: int = 512) -> None:
        super().__init__()
        self.module: Any = None
        self.sync_dtype_name = sync_dtype
        self.bucket_bytes = bucket_mb << 20
        self.calls = 0  # any user call may change the weights: counts as a new version
        self._ipc: IpcStagingBuffers | None = None  # this rank's CUDA IPC staging buffers, when it feeds engines

    # ---- building and calling ---------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def materialize(self, module: Any) -> list[str]:
        self.init_process_group()
        self.device = worker_device()
        self.dtype = compute_dtype("auto", self.device)
        missing = materialize(module, self.device, self.dtype)
        module.missing_parameters = missing
        module.on_weights_materialized()
        self.module = module
        self.offloader = Offloader(module, getattr(module, "optimizer", None), self.device, True, True)
        return missing

    def _require_module(self, what: str) -> Any:
        if self.module is None:
            raise RuntimeError(f"{what}: the train engine holds no weights (build it, or call .cuda() after .meta())")
        return self.module

    @register(Dispatch.ONE_TO_ALL)
    def call_module(self, method: str, *args: Any, **kwargs: Any) -> Any:
        module = self._require_module(method)
        self.offloader.load(with_optimizer=True)
        self.calls += 1
        return getattr(module, method)(*args, **kwargs)

    # ---- residency ------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def to_host(self) -> None:
        """Parameters and optimizer state to host memory (GPU only; on CPU nothing moves)."""
        self._require_module("cpu")
        self.offloader.offload()

    @register(Dispatch.ONE_TO_ALL)
    def to_device(self) -> None:
        self._require_module("cuda")
        self.offloader.load(with_optimizer=True)

    @register(Dispatch.ONE_TO_ALL)
    def release(self) -> None:
        """Drop the module, its optimizer and every tensor they hold (the engine re-materializes on demand)."""
        import gc

        self.module, self.offloader = None, None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- weight export and broadcast sync -------------------------------------------------------------
    def _sync_dtype(self) -> torch.dtype:
        return self.dtype if self.sync_dtype_name == "auto" else compute_dtype(self.sync_dtype_name, self.device)

    def _exported(self, meta: bool) -> dict[str, torch.Tensor]:
        """The module's state as the inference engine sees it (after the output hook). With `meta`, shapes
        only (no gathers); otherwise full tensors (a collective over the ranks)."""
        module = self._require_module("export")
        params = {n: p.detach() for n, p in module.named_parameters()}
        full = {n: torch.empty(p.shape, dtype=p.dtype, device="meta") if meta else _full(p) for n, p in params.items()}
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name, tensor in full.items():
                out.update(module.postprocess_output_named_parameters(name, tensor, full))
        return out

    @register(Dispatch.ONE_TO_ALL)
    def full_state(self, exported: bool = False) -> dict[str, torch.Tensor] | None:
        """Full parameters on rank 0 (None elsewhere; every rank takes part in the gathers): the module's own
        names, or with `exported` what the inference engine receives."""
        self.offloader.load()
        if exported:
            state = self._exported(meta=False)
        else:
            state = {n: _full(p.detach()) for n, p in self._require_module("full_state").named_parameters()}
        return {n: t.cpu().clone() for n, t in state.items()} if self.rank == 0 else None

    @register(Dispatch.RANK_ZERO)
    def weight_sync_layouts(self) -> list[BucketLayout]:
        dtype = self._sync_dtype()
        return plan_buckets(
            ((n, tuple(t.shape), dtype) for n, t in self._exported(meta=True).items()), self.bucket_bytes
        )

    @register(Dispatch.RANK_ZERO)
    def current_weights_version(self) -> int:
        return self.calls

    @register(Dispatch.ONE_TO_ALL)
    def broadcast_weights(self, layouts: list[BucketLayout], fingerprint: bool = False) -> dict[str, float]:
        """Every rank exports (gathers), rank 0 sends; with `fingerprint` rank 0 also returns the
        `WeightFingerprint` of what it sent."""
        self.offloader.load()
        start = time.perf_counter()
        taken = WeightFingerprint() if fingerprint and self.rank == 0 else None
        sent = send_broadcast(
            self._exported_buckets(layouts),
            self._sync_group if self.rank == 0 else None,
            self.device,
            fingerprint=taken,
        )
        metrics = {"rollout/sync_s": time.perf_counter() - start, "rollout/sync_gib": sent / GIB}
        return metrics if taken is None else {**metrics, TRAINER_FINGERPRINT: taken.value}

    @register(Dispatch.ONE_TO_ALL)
    def weights_fingerprint(self, layouts: list[BucketLayout]) -> float:
        """`WeightFingerprint` of the exported weights in the engine's dtype (what a sync sends); a collective."""
        self.offloader.load()
        taken = WeightFingerprint()
        for layout, tensors in self._exported_buckets(layouts):
            taken.add(tensor.to(slot.dtype) for slot, tensor in zip(layout.slots, tensors))
        return taken.value

    def _exported_buckets(self, layouts: list[BucketLayout]) -> Any:
        """The exported full weights (gathered now, a collective), as `(layout, tensors)` per bucket."""
        exported = self._exported(meta=False)
        return ((layout, [exported[name] for name in layout.names]) for layout in layouts)

    @register(Dispatch.ONE_TO_ALL)
    def open_ipc_staging(self, layouts: list[BucketLayout], feeding_ranks: list[int]) -> Any:
        """Ranks in `feeding_ranks` allocate their staging buffers once and return their IPC handles."""
        if self.rank not in feeding_ranks:
            return None
        self._ipc = IpcStagingBuffers(layouts, self.device)
        return self._ipc.handles

    @register(Dispatch.ONE_TO_ALL)
    def send_ipc(self, layouts: list[BucketLayout], targets: list[list[Any]]) -> dict[str, float]:
        """Every rank exports (collective gathers); a rank with targets (inference worker handles on its GPU)
        packs each bucket into its staging buffers and has each target load it in place."""
        self.offloader.load()
        start = time.perf_counter()
        buckets = self._exported_buckets(layouts)  # the gathers run here, on every rank
        sent = send_ipc_to_engines(self._ipc, buckets, targets[self.rank])
        return {"rollout/sync_s": time.perf_counter() - start, "rollout/sync_gib": sent / GIB}

    @register(Dispatch.ONE_TO_ALL)
    def probe_log_probs(self) -> torch.Tensor:
        module = self._require_module("probe_log_probs")
        self.offloader.load()
        return trainer_log_probs(module, probe_sequences(probe_vocab_size(module.config)), self.device)
