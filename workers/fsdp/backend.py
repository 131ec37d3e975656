"""`FSDPBackend`: one FSDP2-sharded HF model with (optionally) its optimizer, LR schedule and checkpoints; the
FSDP2 `TrainBackend` (workers/training/backend.py).

The actor, the reference policy, the critic and the reward model are each one backend; the training logic
(workers/training/) and the workers add what is specific to their role (losses, generation, output keys).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from protocol import DataProto
from workers.cached_blocks import release_after_micro_batch
from workers.fsdp import checkpoint
from workers.fsdp.lora_export import export_lora_hf
from workers.fsdp.model_loading import compute_dtype, load_sharded_model, worker_device
from workers.fsdp.optim import build_lr_scheduler, build_optimizer, clipped_step
from workers.fsdp.sequences import response_log_probs_and_entropy, response_scores, response_values
from workers.lora.model import adapter_parameter_names
from workers.lora.spec import LoraSpec
from workers.moe_router_loss import RouterLogits
from workers.packing.forward import enable_sequence_parallel
from workers.packing.ulysses import SequenceParallel
from workers.routing_replay.passes import ModelRouting, routing_context
from workers.training.backend import (
    DataParallel,
    MicroKeep,
    MicroLoss,
    MicroResults,
    ResponseForward,
    ResponseOutputs,
    require_trainable,
)
from workers.training.micro_batching import MicroBatching
from workers.vision.models import with_vision_lora_default


class FSDPBackend:
    """Build after the process group exists, e.g. `FSDPBackend(AutoModelForCausalLM, cfg["model"], rank,
    optim_cfg=cfg["actor"]["optim"])`. With `optim_cfg=None` the model is frozen: no optimizer, loaded
    directly in the compute dtype. With a `sequence_parallel` group its packed forwards are split over that
    group (Ulysses; `sequence_parallel_setting` names the config key in errors). `shard_size`: the ranks of each
    FSDP shard group (`fsdp_config.fsdp_size`; -1 every rank). `row_parallel_base`: a LoRA base sharded as the
    tensor-parallel engine it will be shared with holds it (workers/fsdp/shared_base.py).
    """

    def __init__(
        self,
        auto_class: Any,
        model_cfg: dict[str, Any],
        rank: int,
        optim_cfg: dict[str, Any] | None = None,
        config_overrides: dict[str, Any] | None = None,
        seed: int = 0,
        sequence_parallel: SequenceParallel | None = None,
        sequence_parallel_setting: str = "ulysses_sequence_parallel_size",
        shard_size: int = -1,
        row_parallel_base: bool = False,
    ) -> None:
        self.auto_class = auto_class
        self.model_path: str = model_cfg["path"]
        self.config_overrides: dict[str, Any] = dict(model_cfg.get("override_config") or {})  # verl's key
        self.rank = rank
        self.device = worker_device()
        self.dtype = compute_dtype(model_cfg["dtype"], self.device)
        self.trainable = optim_cfg is not None
        # LoRA (model_cfg["lora_rank"] > 0) applies to trainable models; a frozen one is the plain base model. A
        # vision-language model's vision tower is left out unless model.exclude_modules says otherwise.
        self.lora: LoraSpec | None = (
            LoraSpec.from_model_config(with_vision_lora_default(model_cfg)) if self.trainable else None
        )
        self.module: nn.Module = load_sharded_model(
            auto_class, model_cfg, self.device, self.trainable, config_overrides, seed, self.lora, shard_size,
            row_parallel_base,
        )
        # Read while sharded (a unit's forward unshards it): 1-D, or (replicate, shard) for hybrid sharding.
        self.mesh: DeviceMesh = next(self.module.parameters()).device_mesh
        # Ranks sharing each packed row (Ulysses): they count a mini-batch's loss units once between them.
        self.sequence_parallel_size = 1 if sequence_parallel is None else sequence_parallel.size
        if sequence_parallel is not None:
            enable_sequence_parallel(self.module, sequence_parallel, sequence_parallel_setting)
        self.optimizer = build_optimizer(self.module, optim_cfg) if optim_cfg is not None else None
        self.router: RouterLogits | None = None  # track_router_loss()
        self.routing: ModelRouting | None = None  # track_routing()
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_cfg) if self.optimizer is not None else None

    @property
    def shard_ranks(self) -> int:
        """The ranks each parameter is sharded over."""
        return int(self.mesh.shape[-1])

    @property
    def replica_groups(self) -> int:
        """How many shard groups hold a copy of the model (hybrid sharding: more than one)."""
        return int(self.mesh.shape[0]) if self.mesh.ndim == 2 else 1

    # ---- micro-batches --------------------------------------------------------------------------------
    def data_parallel(self) -> DataParallel:
        """FSDP averages gradients over every rank; a Ulysses group's k ranks hold the same rows."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        return DataParallel(world // self.sequence_parallel_size, None, self.sequence_parallel_size)

    def reports_outputs(self) -> bool:
        return True

    def micro_batches(self, data: DataProto, batching: MicroBatching) -> tuple[list[DataProto], list[int]]:
        return batching.split(data, self.device)

    def response_outputs(self, micro: DataProto, forward: ResponseForward) -> ResponseOutputs:
        """The HF model's forward over one micro-batch (packed when the model is), at the response tokens."""
        if forward.kind == "values":
            return ResponseOutputs(self.device, values=response_values(self.module, micro, self.device))
        if forward.kind == "scores":
            return ResponseOutputs(self.device, scores=response_scores(self.module, micro, self.device))
        capture = self.router is not None and self.module.training and torch.is_grad_enabled()
        with self.router.capturing() if capture else contextlib.nullcontext():
            log_probs, entropy = response_log_probs_and_entropy(
                self.module, micro, self.device, forward.temperature, forward.with_entropy, forward.entropy_grad
            )
        router_loss = self.router.balance_loss(micro.batch["attention_mask"]) if capture else None
        return ResponseOutputs(self.device, log_probs=log_probs, entropy=entropy, router_loss=router_loss)

    def track_router_loss(self) -> None:
        """Compute the routers' load-balancing loss in every training forward (a mixture-of-experts model)."""
        config = getattr(self.module.config, "text_config", None) or self.module.config
        self.router = RouterLogits(self.module, int(config.num_experts_per_tok))

    def track_routing(self) -> None:
        """Hooks on the routers for routing replay (workers/routing_replay/passes.py)."""
        self.routing = ModelRouting(self.module, self.device)

    def forward_backward(self, micros: list[DataProto], forward: ResponseForward, loss_fn: MicroLoss) -> MicroResults:
        require_trainable(self.optimizer, "forward_backward")
        self.module.train()
        results = MicroResults()
        replicated = self.replica_groups > 1
        for index, micro in enumerate(micros):
            if replicated:  # the replicas sum their gradient shards once, in the last micro-batch's backward
                self.module.set_requires_all_reduce(index == len(micros) - 1)
            # A replayed routing holds through the backward too: checkpointed layers route again there.
            with routing_context(self.routing, micro):
                loss, kept = loss_fn(self.response_outputs(micro, forward), micro)
                loss.backward()
            results.cached_block_releases += release_after_micro_batch(self.device)
            results.kept.append(kept)
        return results

    def forward_only(
        self, micros: list[DataProto], forward: ResponseForward, keep: MicroKeep
    ) -> list[dict[str, torch.Tensor]]:
        self.module.eval()
        kept = []
        with torch.no_grad():
            for micro in micros:
                with routing_context(self.routing, micro) as recorded:
                    outputs = self.response_outputs(micro, forward)
                if recorded:  # a recording pass (routing replay R2): the experts this forward chose
                    outputs = dataclasses.replace(outputs, routed_experts=recorded[0])
                kept.append(keep(outputs, micro))
                release_after_micro_batch(self.device)
        return kept

    # ---- training -------------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        require_trainable(self.optimizer, "zero_grad")
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self, grad_clip: float) -> float:
        """Clip and step; a non-finite gradient norm skips the step (same on every rank: the norm is global)."""
        require_trainable(self.optimizer, "optimizer_step")
        return clipped_step(self.module, self.optimizer, grad_clip)

    def current_lr(self) -> float:
        require_trainable(self.optimizer, "current_lr")
        return float(self.lr_scheduler.get_last_lr()[0])

    def lr_scheduler_step(self) -> None:
        require_trainable(self.optimizer, "lr_scheduler_step")
        self.lr_scheduler.step()

    def synced_parameter_names(self) -> list[str] | None:
        """What a weight sync sends: the adapter factors with LoRA (the engine keeps the base), else None (all)."""
        return adapter_parameter_names(self.module) if self.lora is not None else None

    # ---- checkpoints ----------------------------------------------------------------------------------
    def _lora_state(self) -> dict[str, Any]:
        # Recorded in every checkpoint: a LoRA checkpoint holds only the adapter, so the settings must match.
        return {"lora": None if self.lora is None else dataclasses.asdict(self.lora)}

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None:
        """Model (with LoRA: the adapter only) and optimizer shards, LR schedule, RNG and the caller's `extra`."""
        require_trainable(self.optimizer, "save_checkpoint")
        state = {"lr_scheduler": self.lr_scheduler.state_dict(), **self._lora_state(), **(extra or {})}
        checkpoint.save_sharded(
            path, self.module, self.optimizer, state, self.rank, trainable_only=self.lora is not None
        )

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore everything `save_checkpoint` wrote; returns the caller's `extra` entries."""
        require_trainable(self.optimizer, "load_checkpoint")
        extra = checkpoint.load_sharded(
            path,
            self.module,
            self.optimizer,
            self.rank,
            trainable_only=self.lora is not None,
            must_match=self._lora_state(),
        )
        self.lr_scheduler.load_state_dict(extra.pop("lr_scheduler"))
        return extra

    def export_hf(self, path: str) -> None:
        """An HF folder of the model; with LoRA the merged model, plus the adapter alone in `path/lora_adapter`."""
        if self.lora is None:
            checkpoint.export_hf(self.module, self.auto_class, path, self.model_path, self.rank)
        else:
            export_lora_hf(self.module, self.auto_class, path, self.model_path, self.rank, self.lora)
