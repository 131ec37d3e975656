"""Driver side of the weight sync between a trainer group (the actor, or the engine API's train engine) and a
separate group of engines: a broadcast (`SeparateWeightSync`) or CUDA IPC on shared GPUs (`IpcRolloutSync`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from transformers import AutoConfig

from workers.moe_config import model_has_experts
from workers.rollout.sync_path import CUDA_IPC, choose_sync_path
from workers.rollout.verify import TRAINER_FINGERPRINT, require_changed, verify_engines
from workers.vision.models import probe_vocab_size


class _VersionedSync:
    """What both syncs share: `sync()` sends (the subclass's `_send`) only when the actor's weights version differs
    from the engines'."""

    def __init__(self, actor: Any, model_path: str, engines_start_from_trainer: bool) -> None:
        self.actor = actor
        self.engines_start_from_trainer = engines_start_from_trainer
        config = AutoConfig.from_pretrained(model_path)
        self.vocab_size, self.experts = probe_vocab_size(config), model_has_experts(config)
        self.synced_version = 0 if engines_start_from_trainer else -1  # 0: the engines loaded the actor's folder
        self.actor_version = 0  # the actor's weights version at the last sync() (synced or not)

    def sync(self, engines_idle: Callable[[], AbstractContextManager] = nullcontext) -> dict[str, float]:
        """Send the actor's weights if they changed since the last sync; `engines_idle()` keeps generating
        engines paused around what must see one engine state (`_send` says what)."""
        version = self.actor.current_weights_version()
        self.actor_version = version
        if version == self.synced_version:
            return {}
        metrics = self._send(version, engines_idle)
        self.synced_version = version
        return metrics


class SeparateWeightSync(_VersionedSync):
    """`connect()` once, then `sync()` whenever the actor's weights changed. Both groups run their side at
    the same time: the engines' receive calls are issued first (non-blocking), then the actor's send."""

    def __init__(
        self,
        actor: Any,
        rollout: Any,
        rollout_cfg: dict[str, Any],
        model_path: str,
        use_gpu: bool,
        engines_start_from_trainer: bool = True,
    ) -> None:
        """`engines_start_from_trainer`: the engines hold the trainer's weights at `connect()` (both loaded
        the same folder); when not (another source, or a LoRA trainer whose adapter the engines do not have
        yet), the first `sync()` always sends, and its change of weights is not checked (the probe still is)."""
        super().__init__(actor, model_path, engines_start_from_trainer)
        self.rollout, self.cfg = rollout, rollout_cfg
        self.backend = "nccl" if use_gpu else "gloo"
        self.layouts: list | None = None
        self.trainer_fingerprint: float | None = None  # of the weights the engines hold, taken on the trainer

    def connect(self) -> None:
        world = 1 + self.rollout.world_size * self.cfg["tensor_model_parallel_size"]
        address = self.actor.host_weight_sync(world, self.backend)
        joined = self.rollout.join_weight_sync(address)
        self.actor.connect_weight_sync(address)
        joined.get()
        self.layouts = self.actor.weight_sync_layouts()
        if self.cfg["verify_sync"] and self.engines_start_from_trainer:
            # What the engines hold now (the model folder), as the trainer would send it.
            self.trainer_fingerprint = self.actor.weights_fingerprint(self.layouts)[0]

    def _send(self, version: int, engines_idle: Callable[[], AbstractContextManager]) -> dict[str, float]:
        """Broadcast, verifying when configured. Only the checks (fingerprints before and after, the probe) run
        inside `engines_idle()`, since each engine pauses itself for the whole load inside `receive_weights`."""
        if self.layouts is None:
            self.connect()
        verify = self.cfg["verify_sync"]
        with engines_idle() if verify else nullcontext():
            before = self.rollout.weights_fingerprint() if verify and self.trainer_fingerprint is not None else None
            received = self.rollout.receive_weights(self.layouts, version)
            metrics = dict(self.actor.broadcast_weights(self.layouts, fingerprint=verify)[0])
            trainer_after = metrics.pop(TRAINER_FINGERPRINT, None)
            received.get()
            if verify:
                dtype, tolerance = self.layouts[0].slots[0].dtype, self.cfg["verify_tolerance"]
                metrics.update(
                    verify_engines(
                        self.actor, self.rollout, self.vocab_size, dtype, tolerance, "broadcast weight sync",
                        self.experts,
                    )
                )
            if before is not None:
                after = self.rollout.weights_fingerprint()
                for engine, (old, new) in enumerate(zip(before, after)):
                    where = f"broadcast weight sync to engine {engine}"
                    require_changed(old, new, self.trainer_fingerprint, trainer_after, where)
            self.trainer_fingerprint = trainer_after
        return metrics


class IpcEngineSync:
    """The CUDA IPC transfer. Each train rank sharing its GPU with engines allocates two staging buffers once and
    hands their IPC handles to those engines, which map them once; a sync then has every train rank gather the
    full weights (collective) while each feeding rank packs bucket after bucket into its buffers and has its
    engines load each bucket in place: one device-local copy per byte, no NCCL group on one GPU."""

    def __init__(self, train: Any, infer: Any, feeding_rank: tuple[int, ...], vocab_size: int, verify: bool,
                 tolerance: float | None, experts: bool = False) -> None:
        self.train, self.infer, self.feeding_rank = train, infer, feeding_rank
        self.vocab_size, self.verify, self.tolerance, self.experts = vocab_size, verify, tolerance, experts
        self.layouts: list | None = None

    def sync(self, version: int | None = None) -> dict[str, float]:
        """Send the weights; `version` (the trainer's weights version) goes to the engines."""
        if self.layouts is None:  # the staging buffers are mapped at the first sync
            self.layouts = self.train.weight_sync_layouts()
            handles = self.train.open_ipc_staging(self.layouts, sorted(set(self.feeding_rank)))
            self.infer.open_ipc_buffers([handles[rank] for rank in self.feeding_rank])
        workers = self.infer.workers
        targets = [[workers[i] for i, rank in enumerate(self.feeding_rank) if rank == train_rank]
                   for train_rank in range(self.train.world_size)]
        metrics = self.train.send_ipc(self.layouts, targets)[0]
        self.infer.finish_weight_load(version)
        if self.verify:
            dtype = self.layouts[0].slots[0].dtype
            metrics.update(
                verify_engines(
                    self.train, self.infer, self.vocab_size, dtype, self.tolerance, "CUDA IPC weight sync", self.experts
                )
            )
        return metrics


class IpcRolloutSync(_VersionedSync):
    """The separate engines share the trainer ranks' GPUs (fractional GPU shares: NCCL refuses two group ranks
    on one device): each bucket goes by CUDA IPC from the train rank on the engine's GPU (`IpcEngineSync`). Same
    interface, version stamping and `engines_start_from_trainer` as `SeparateWeightSync`; the probe check runs
    when `verify_sync` is set."""

    def __init__(
        self,
        actor: Any,
        rollout: Any,
        feeding_rank: tuple[int, ...],
        rollout_cfg: dict[str, Any],
        model_path: str,
        engines_start_from_trainer: bool = True,
    ) -> None:
        super().__init__(actor, model_path, engines_start_from_trainer)
        verify, tolerance = bool(rollout_cfg["verify_sync"]), rollout_cfg["verify_tolerance"]
        self.transfer = IpcEngineSync(actor, rollout, feeding_rank, self.vocab_size, verify, tolerance, self.experts)

    def connect(self) -> None:
        """Nothing to set up before the first sync (the staging buffers are mapped then)."""

    def _send(self, version: int, engines_idle: Callable[[], AbstractContextManager]) -> dict[str, float]:
        """`engines_idle()` is held for the whole transfer, since the engines load bucket by bucket (one call
        each) and must not step on half-loaded weights."""
        with engines_idle():
            return self.transfer.sync(version)


def rollout_weight_sync(
    actor: Any,
    rollout: Any,
    rollout_cfg: dict[str, Any],
    model_path: str,
    use_gpu: bool,
    engines_start_from_trainer: bool = True,
) -> SeparateWeightSync | IpcRolloutSync:
    """The sync of a separate rollout group, by where its engines run: on GPUs of their own (broadcast, NCCL;
    gloo on CPU), or on the actor ranks' GPUs (CUDA IPC). `engines_start_from_trainer` as in `SeparateWeightSync`."""
    path = choose_sync_path(actor.node_info, rollout.node_info, use_gpu, rollout_cfg["tensor_model_parallel_size"])
    if path.kind != CUDA_IPC:
        return SeparateWeightSync(actor, rollout, rollout_cfg, model_path, use_gpu, engines_start_from_trainer)
    if not engines_start_from_trainer:
        raise ValueError(
            "the rollout engines share the actor's GPUs (CUDA IPC weight sync), which sends full weights only, not a "
            "LoRA adapter: give the engines GPUs of their own "
            "(trainer.gpus_per_process=1, rollout.gpus_per_engine=null)"
        )
    if not hasattr(actor, "send_ipc"):
        raise ValueError(
            f"the rollout engines share the actor's GPUs, which needs a CUDA IPC weight sync that the "
            f"{actor.worker_class.__name__} actor does not have: give the engines GPUs of their own "
            "(trainer.gpus_per_process=1, rollout.gpus_per_engine=null)"
        )
    return IpcRolloutSync(actor, rollout, path.feeding_rank, rollout_cfg, model_path)
