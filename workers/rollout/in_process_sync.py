"""In-process weight sync: a trainer's weights streamed into an engine living in the same process, then checked.

One implementation for the hybrid rollout (workers/rollout/hybrid.py) and the strategy API's inference engine
(workers/strategy/inference.py). Every trainer rank walks the weight stream (its gathers are collectives); the
rank holding the engine loads it. With `verify`, after each load the engine must score a fixed probe batch as
the trainer does, and its weights must change exactly when the trainer's did since the previous load
(workers/rollout/verify.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist

from workers.lora.spec import LoraSpec
from workers.rollout.buckets import BucketLayout, payload_bytes
from workers.rollout.engine_group import EngineGroup
from workers.rollout.verify import (
    SyncBound,
    WeightFingerprint,
    WeightSyncMismatch,
    compare_log_probs,
    fingerprinted,
    probe_sequences,
    require_changed,
    require_match,
)
from workers.rollout.weight_sync import WeightBuckets

GIB = float(1 << 30)
WORST_DIFF = "rollout/sync_logprob_scaled_max_diff"  # the engine that differs most, relative to its bound

# What the engine's rank concludes from a check: its metrics, or the error every rank then raises.
Outcome = tuple[dict[str, float] | None, str | None]


class WeightSource(Protocol):
    """What an in-process engine needs from the trainer it shares a process with (FSDP or Megatron)."""

    model_path: str
    config_overrides: dict[str, Any]  # config.json fields the trainer's model was built with (model.override_config)
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    experts: bool  # a mixture of experts (its sync check's default bound, verify.SyncBound.of)
    lora: LoraSpec | None  # a LoRA trainer sends only its adapter; the engine keeps the folder's base weights

    def sync_layouts(self, dtype: torch.dtype, bucket_bytes: int) -> list[BucketLayout]: ...

    def named_weights(self, layouts: list[BucketLayout]) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, whole tensor) pairs of the current weights; a collective over the trainer's ranks."""
        ...

    def buckets(self, layouts: list[BucketLayout], cast: bool = True) -> WeightBuckets:
        """The same weights as `(layout, tensors)` per bucket, for a send to engines in other processes; with
        `cast` False a tensor may still be in the trainer's dtype (the sender casts while it packs)."""
        ...

    def probe_log_probs(self, probe: torch.Tensor) -> torch.Tensor:
        """log p(token_t | tokens_<t) [rows, length - 1] on every rank; a collective."""
        ...


class InProcessEngine(Protocol):
    """What the sync calls on the engine (`VLLMEngine`, or the strategy's `HFGenerateEngine`)."""

    def load_weights(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int: ...

    def load_adapter(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int: ...  # LoRA sources only

    def fingerprint(self) -> float: ...

    def prompt_log_probs(self, sequences: torch.Tensor) -> torch.Tensor: ...


class InProcessSync:
    def __init__(
        self,
        engine: InProcessEngine | None,
        layouts: list[BucketLayout],
        dtype: torch.dtype,
        verify: bool,
        tolerance: float | None,
        where: str,
        group: EngineGroup | None = None,
        every_rank: bool = False,
        tolerance_setting: str = "rollout.verify_tolerance",
        experts: bool = False,
    ) -> None:
        """`engine`: None on the ranks that only feed it (a group's members). `dtype`: the engine's, which picks
        the default tolerance. `where` names the sync in errors, `tolerance_setting` the setting that changes the
        bound. `group`: the ranks sharing the engine, which all raise its error. `every_rank`: every rank of the
        default process group raises any engine's error (a rank failing alone would leave the others waiting in
        their next collective). `experts`: a mixture of experts (its default bound, `SyncBound.of`)."""
        self.engine, self.layouts, self.verify = engine, layouts, verify
        self.bound = SyncBound.of(dtype, experts, tolerance)
        self.where, self.tolerance_setting = where, tolerance_setting
        self.group, self.every_rank = group, every_rank
        # The trainer's fingerprint of what the engine holds, as sent; None until known (the first load then
        # checks the probe only).
        self.trainer_fingerprint: float | None = None

    def take_trainer_fingerprint(self, source: WeightSource) -> None:
        """Fingerprint the trainer's current weights as they would be sent: call it when the engine holds them
        already (it loaded the folder the trainer started from). A collective."""
        taken = WeightFingerprint()
        taken.add(tensor for _, tensor in source.named_weights(self.layouts))
        self.trainer_fingerprint = taken.value

    def load(self, source: WeightSource, compare: bool = True) -> dict[str, float]:
        """Stream `source`'s weights (its adapter, for a LoRA source) into the engine; with `verify`, check them.
        `compare` False: the engine's weights were released (sleep), so there is no before to compare with.
        Returns `rollout/sync_*` metrics. A collective over the trainer's ranks."""
        engine = self.engine
        compares = self.verify and compare and engine is not None and self.trainer_fingerprint is not None
        fingerprinting = time.perf_counter()
        before = engine.fingerprint() if compares else None
        check_s = time.perf_counter() - fingerprinting  # the check's share of the sync, beside the load's
        sent = WeightFingerprint()
        pairs = source.named_weights(self.layouts)
        start = time.perf_counter()
        if engine is None:
            loaded = sum(1 for _ in pairs)  # its part of the gathers; the engine's rank loads them
        else:
            load = engine.load_weights if source.lora is None else engine.load_adapter
            loaded = load(fingerprinted(pairs, sent) if self.verify else pairs)
        metrics = {
            "rollout/sync_s": time.perf_counter() - start,
            "rollout/sync_gib": sum(b.nbytes for b in self.layouts) / GIB,
            "rollout/sync_bytes": float(payload_bytes(self.layouts)),
            "rollout/sync_tensors": float(loaded),
        }
        if self.verify:
            checking = time.perf_counter()
            metrics.update(self._check(source, self.where, before, sent.value))
            metrics["rollout/sync_check_s"] = check_s + time.perf_counter() - checking
            self.trainer_fingerprint = sent.value
        return metrics

    def check_probe(self, source: WeightSource, where: str) -> dict[str, float]:
        """The probe check alone, of whatever the engine holds now. A collective."""
        return self._check(source, where, None, 0.0)

    def _check(self, source: WeightSource, where: str, before: float | None, sent: float) -> dict[str, float]:
        probe = probe_sequences(source.vocab_size)
        trainer = source.probe_log_probs(probe)  # a collective: every rank runs the trainer's forward
        outcome: Outcome = (None, None)
        if self.engine is not None:
            try:
                check = compare_log_probs(
                    trainer, self.engine.prompt_log_probs(probe), self.bound, source.vocab_size
                )
                require_match(check, where, self.tolerance_setting)
                if before is not None:
                    require_changed(before, self.engine.fingerprint(), self.trainer_fingerprint, sent, where)
                outcome = (check.metrics(), None)
            except WeightSyncMismatch as error:
                outcome = (None, str(error))
        metrics, error = self._shared(outcome)
        if error is not None:
            raise WeightSyncMismatch(error)
        return metrics or {}

    def _shared(self, outcome: Outcome) -> Outcome:
        """The engine's outcome on the ranks that raise with it: its group, or with `every_rank` all ranks
        (the first error, else the metrics of the engine that differs most)."""
        if self.group is not None:
            outcome = self.group.from_leader(outcome)
        if not self.every_rank:
            return outcome
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, outcome)
        errors = [error for _, error in everyone if error is not None]
        if errors:
            return None, errors[0]
        return max((metrics for metrics, _ in everyone), key=lambda metrics: metrics[WORST_DIFF]), None
