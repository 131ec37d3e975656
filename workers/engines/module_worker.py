"""`ModuleWorker`: runs a user's `TrainModule` as one rank of a train engine.

Any public method of the module is called through `call_module` (NeedParallel arguments split by the
dispatcher, others sent whole). Weight export for the inference engine goes through the module's
`postprocess_output_named_parameters` hook, so e.g. a LoRA model sends merged base weights.
"""

from __future__ import annotations

from typing import Any

import torch

from single_controller import Dispatch, Worker, register
from workers.engines.materialize import materialize
from workers.fsdp.model_loading import compute_dtype, worker_device
from workers.fsdp.offload import Offloader
from workers.rollout.buckets import BucketLayout, plan_buckets
from workers.rollout.verify import trainer_log_probs
from workers.rollout.weight_sender import WeightSenderMixin
from workers.rollout.weight_sync import WeightBuckets, full_parameter
from workers.vision.models import probe_vocab_size


class ModuleWorker(WeightSenderMixin, Worker):
    """The broadcast and CUDA IPC sends, the fingerprint and the probe are the actor's (`WeightSenderMixin`), over
    the module's exported weights."""

    def __init__(self, sync_dtype: str = "auto", bucket_mb: int = 512) -> None:
        super().__init__()
        self.module: Any = None
        self.sync_dtype_name = sync_dtype
        self.bucket_bytes = bucket_mb << 20
        self.calls = 0  # any user call may change the weights: counts as a new version

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

    # ---- weight export (the sends are WeightSenderMixin's) --------------------------------------------------
    def _sync_source(self) -> "ExportedWeights":
        """The module's exported weights, its parameters on the device."""
        self._require_module("weight sync")
        self.offloader.load()
        return ExportedWeights(self)

    def exported_state(self, meta: bool) -> dict[str, torch.Tensor]:
        """The module's state as the inference engine sees it (after the output hook). With `meta`, shapes
        only (no gathers); otherwise full tensors (a collective over the ranks)."""
        module = self._require_module("export")
        full = {
            n: torch.empty(p.shape, dtype=p.dtype, device="meta") if meta else full_parameter(p.detach())
            for n, p in module.named_parameters()
        }
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
            state = self.exported_state(meta=False)
        else:
            state = {n: full_parameter(p.detach()) for n, p in self._require_module("full_state").named_parameters()}
        return {n: t.cpu().clone() for n, t in state.items()} if self.rank == 0 else None

    @register(Dispatch.RANK_ZERO)
    def weight_sync_layouts(self) -> list[BucketLayout]:
        dtype = self.dtype if self.sync_dtype_name == "auto" else compute_dtype(self.sync_dtype_name, self.device)
        return plan_buckets(
            ((n, tuple(t.shape), dtype) for n, t in self.exported_state(meta=True).items()), self.bucket_bytes
        )

    @register(Dispatch.RANK_ZERO)
    def current_weights_version(self) -> int:
        return self.calls


class ExportedWeights:
    """A `ModuleWorker`'s module as the source of the weight sends (`WeightSenderMixin`): what the module's output
    hook exports, whole; the probe runs the module itself."""

    def __init__(self, worker: ModuleWorker) -> None:
        self.worker = worker
        self.device = worker.device
        self.vocab_size = probe_vocab_size(worker.module.config)

    def buckets(self, layouts: list[BucketLayout], cast: bool = True) -> WeightBuckets:
        """`(layout, tensors)` per bucket (cast to the layout's dtypes with `cast`)."""
        exported = self.worker.exported_state(meta=False)  # the gathers run now, on every rank
        return (
            (layout, [exported[slot.name].to(slot.dtype) if cast else exported[slot.name] for slot in layout.slots])
            for layout in layouts
        )

    def probe_log_probs(self, probe: torch.Tensor) -> torch.Tensor:
        return trainer_log_probs(self.worker.module, probe, self.device)
