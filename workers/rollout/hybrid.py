"""`HybridRollout`: a vLLM engine inside the actor's own process, fed by in-process weight sync.

Per generate call: wake the engine, load the actor's current weights if they changed (or were
released by sleep), optionally verify them, generate, then sleep again so the actor has
the device for log-probs and the update. A LoRA actor sends only its adapter (see workers/lora).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from workers.fsdp.backend import FSDPBackend
from workers.fsdp.model_loading import compute_dtype
from workers.moe_config import model_has_experts
from workers.rollout.buckets import BucketLayout
from workers.rollout.engine_group import EngineGroup, group_devices, sleep_engine
from workers.rollout.engine_start_memory import start_memory_metrics
from workers.rollout.in_process_sync import InProcessSync, WeightSource
from workers.rollout.verify import trainer_log_probs
from workers.rollout.vllm_engine import VLLMEngine
from workers.rollout.vllm_options import sleeps_between_calls
from workers.rollout.vllm_requests import draw_seed
from workers.rollout.weight_sync import WeightBuckets, gathered_buckets, named_full_parameters, plan_model_buckets
from workers.vision.models import probe_vocab_size


class FSDPWeightSource:
    """An FSDP2 engine as a weight source: parameters all-gathered bucket by bucket."""

    def __init__(self, actor: FSDPBackend) -> None:
        self.actor = actor
        self.model_path, self.device, self.dtype = actor.model_path, actor.device, actor.dtype
        self.config_overrides = actor.config_overrides
        self.vocab_size = probe_vocab_size(actor.module.config)
        self.experts = model_has_experts(actor.module.config)
        self.lora = actor.lora

    def sync_layouts(self, dtype: torch.dtype, bucket_bytes: int) -> list[BucketLayout]:
        # The actor is an FSDPBackend or the strategy API's PreparedModel: both say which parameters a sync sends.
        return plan_model_buckets(self.actor.module, dtype, bucket_bytes, self.actor.synced_parameter_names())

    def named_weights(self, layouts: list[BucketLayout]) -> Iterator[tuple[str, torch.Tensor]]:
        return named_full_parameters(self.actor.module, layouts)

    def buckets(self, layouts: list[BucketLayout], cast: bool = True) -> WeightBuckets:
        return gathered_buckets(self.actor.module, layouts, cast=cast)

    def probe_log_probs(self, probe: torch.Tensor) -> torch.Tensor:
        return trainer_log_probs(self.actor.module, probe, self.device)


def engine_dtype(rollout_cfg: dict[str, Any], source: WeightSource) -> torch.dtype:
    return source.dtype if rollout_cfg["dtype"] == "auto" else compute_dtype(rollout_cfg["dtype"], source.device)


class HybridRollout:
    def __init__(
        self, source: WeightSource, rollout_cfg: dict[str, Any], seed: int, rank: int, shares_weights: bool = False,
        group: EngineGroup | None = None,
    ) -> None:
        """`seed`: the run's; an engine samples from `seed` + its (first) trainer rank. `shares_weights`: the
        source's frozen base will point into the engine's weights (LoRA, workers/fsdp/shared_base.py); the engine
        then keeps them in place while asleep. `group`: the trainer ranks sharing one tensor-parallel engine
        (workers/rollout/engine_group.py): one shard on each, or the whole engine on the leader."""
        self.source = source
        self.cfg = rollout_cfg
        self.group = group
        self.dtype = engine_dtype(rollout_cfg, source)
        devices = group_devices(group, source.device) if group is not None else None
        shard_per_process = group is not None and group.per_rank
        self.engine: VLLMEngine | None = None
        if group is None or group.holds_engine:
            first_rank = rank if group is None else group.leader  # the shards of one engine sample alike
            self.engine = VLLMEngine(
                source.model_path, rollout_cfg, self.dtype, source.device, seed + first_rank,
                lora=source.lora, shares_weights=shares_weights, config_overrides=source.config_overrides,
                visible_devices=devices, shard_per_process=shard_per_process,
            )
        # Reported once at the start: an engine's tensor-parallel shards held in trainer processes (k for a shard
        # per rank, 1 for an engine over one GPU in this process, 0 when the engine computes in processes of its own).
        shards = group.size if shard_per_process else 1
        in_trainers = shards if self.engine is not None and self.engine.in_process else 0
        self.start_metrics = {"rollout/engine_shards_in_trainers": float(in_trainers)}
        if self.engine is not None:  # the memory plan's estimate of it is a note of trainer.plan_only=true
            self.start_metrics["rollout/kv_cache_sequences"] = self.engine.kv_cache_sequences()
            self.start_metrics.update(start_memory_metrics(self.engine.start_memory_figures()))
        self.layouts: list[BucketLayout] = source.sync_layouts(self.dtype, rollout_cfg["weight_sync_bucket_mb"] << 20)
        # The engine loaded the same folder the actor started from; a LoRA engine has no adapter yet, so its
        # first sync (before the first generate) always runs.
        self.synced_version = 0 if source.lora is None else -1
        self.weights = InProcessSync(
            self.engine, self.layouts, self.dtype, rollout_cfg["verify_sync"], rollout_cfg["verify_tolerance"],
            "in-process weight sync", group=group,
            experts=source.experts,
        )
        # The folder's weights as the trainer would send them: the first sync's change check compares with them
        # (a LoRA engine has no adapter before its first sync: that sync checks the probe only).
        if rollout_cfg["verify_sync"] and source.lora is None:
            self.weights.take_trainer_fingerprint(source)

    def close(self) -> None:
        """The engine (or this rank's shard of it) shut down for good: the worker is about to be killed."""
        if self.engine is not None:
            self.engine.close()

    def _wake(self) -> bool:
        """Wake the engine; whether its weights were released (then a sync must send them), on every rank. In a
        group whose leader holds the engine, on GPUs every rank first returns its cached blocks, since the engine's
        workers wake on all their GPUs (a shard per rank wakes on its own GPU, which `wake_up` readies)."""
        if self.group is not None and not self.group.per_rank and self.source.device.type == "cuda":
            torch.cuda.empty_cache()
            self.group.from_leader(None)  # every rank's cache is back before the leader wakes the engine
        released = self.engine.wake_up() if self.engine is not None else False
        return released if self.group is None else bool(self.group.from_leader(released))

    def _generate_in_group(self, batch: tuple[Any, int, Any], params: Any, call_seed: int | None) -> Any:
        """This rank's rows of one engine call over every rank's `batch` of the group: every shard runs the same
        requests and seeds (a seed drawn once, the leader's, when unseeded), or the leader runs them and scatters."""
        if self.group.per_rank:
            batches = self.group.all_gather(batch)
            shared_seed = self.group.from_leader(draw_seed() if call_seed is None else call_seed)
            return self.engine.generate_many(batches, params, shared_seed)[self.group.ranks.index(self.group.rank)]
        batches = self.group.gather(batch)
        results = self.engine.generate_many(batches, params, call_seed) if self.engine is not None else None
        return self.group.scatter(results)

    def sync(self, version: int, force: bool = False) -> dict[str, float]:
        """Load the actor's weights into the engine unless it already has `version` (`force`: its weights were
        released, load them anyway). Collective (in a group every rank produces the weights, the leader loads them)."""
        if version == self.synced_version and not force:
            return {}
        metrics = self.weights.load(self.source, compare=not force)
        self.synced_version = version
        return metrics

    @property
    def syncs_at_generate(self) -> bool:
        """The engine sleeps between calls, dropping the weights (or the adapter) each time: `generate`
        loads them, and `sync_now` has nothing to do (so the caller need not bring the actor's weights)."""
        return sleeps_between_calls(self.cfg, self.source.device)

    def sync_now(self, version: int) -> dict[str, float]:
        """Bring the engine to `version` now. An engine that sleeps between calls would drop the weights
        (or the adapter) at its next sleep, so nothing is loaded here: the next `generate` wakes it and
        loads them once (one load per step instead of one per sync call)."""
        if self.syncs_at_generate:
            return {}
        released = self._wake()
        metrics = self.sync(version, force=released)
        sleep_engine(self.engine, self.group)
        return metrics

    def verify(self, where: str) -> dict[str, float]:
        """Probe log-probs of engine vs trainer (a collective: every trainer rank runs the trainer's forward; in
        a group the leader compares, and every rank returns its result or raises its error)."""
        return self.weights.check_probe(self.source, where)

    def generate(
        self,
        prompts: dict[str, torch.Tensor],
        params: Any,
        call_seed: int | None,
        rank: int,
        version: int,
        after_sync: Callable[[], None] | None = None,
        run: Callable[[VLLMEngine], dict[str, torch.Tensor]] | None = None,
        before_sync: Callable[[], None] | None = None,
        images: list[list[Any]] | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Wake; if the engine needs weights, run `before_sync` (e.g. bring the offloaded actor's parameters
        to the GPU: skipped when nothing is sent) and sync; run `after_sync` (e.g. offload them again so the
        engine has the memory), generate (or `run(engine)`, e.g. a multi-turn rollout; not in a group), sleep.
        In a group the prompts of every rank are generated in one engine call (on every rank holding a shard, with
        the same requests and seeds, or on the leader); each rank returns its own rows."""
        if run is not None and self.group is not None:
            raise ValueError("a hybrid engine shared by several trainer ranks generates single-turn batches only")
        released = self._wake()
        if before_sync is not None and (released or version != self.synced_version):
            before_sync()
        metrics = self.sync(version, force=released)
        if after_sync is not None:
            after_sync()
        start = time.perf_counter()
        if self.group is not None:
            batch = ({k: v.cpu() for k, v in prompts.items()}, rank, images)
            result = self._generate_in_group(batch, params, call_seed)
        elif run is not None:
            result = run(self.engine)
        else:
            result = self.engine.generate(prompts, params, call_seed, rank, images=images)
        metrics["rollout/generate_s"] = time.perf_counter() - start
        sleep_engine(self.engine, self.group)
        return result, metrics
