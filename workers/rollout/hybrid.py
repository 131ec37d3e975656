"""`HybridRollout`: a vLLM engine inside the actor's own process, fed by in-process weight sync.

Per generate call: wake the engine, load the actor's current weights if they changed (or were
released by sleep), optionally verify them, generate, then sleep again so the actor has
the device for log-probs and the update.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from workers.fsdp.engine import FSDPEngine
from workers.fsdp.model_loading import compute_dtype
from workers.rollout.buckets import BucketLayout
from workers.rollout.verify import DEFAULT_TOLERANCE, compare_log_probs, probe_sequences, require_changed, require_match, trainer_log_probs
from workers.rollout.vllm_engine import VLLMEngine
from workers.rollout.weight_sync import named_full_parameters, plan_model_buckets

GIB = float(1 << 30)


def engine_dtype(rollout_cfg: dict[str, Any], actor: FSDPEngine) -> torch.dtype:
    return actor.dtype if rollout_cfg["dtype"] == "auto" else compute_dtype(rollout_cfg["dtype"], actor.device)


def sync_tolerance(rollout_cfg: dict[str, Any], dtype: torch.dtype) -> float:
    return rollout_cfg["verify_tolerance"] or DEFAULT_TOLERANCE[dtype]


class HybridRollout:
    def __init__(self, actor: FSDPEngine, rollout_cfg: dict[str, Any], seed: int) -> None:
        self.actor = actor
        self.cfg = rollout_cfg
        self.dtype = engine_dtype(rollout_cfg, actor)
        self.engine = VLLMEngine(actor.model_path, rollout_cfg, self.dtype, actor.device, seed)
        self.layouts: list[BucketLayout] = plan_model_buckets(actor.module, self.dtype, rollout_cfg["weight_sync_bucket_mb"] << 20)
        self.synced_version = 0  # the engine loaded the same folder the actor started from

    def sync(self, version: int, force: bool = False) -> dict[str, float]:
        """Load the actor's weights into the engine unless it already has `version`. Collective."""
        if version == self.synced_version and not force:
            return {}
        verify = self.cfg["verify_sync"]
        before = self.engine.fingerprint() if verify and not force else None
        start = time.perf_counter()
        loaded = self.engine.load_weights(named_full_parameters(self.actor.module, self.layouts))
        seconds = time.perf_counter() - start
        metrics = {
            "rollout/sync_s": seconds,
            "rollout/sync_gib": sum(b.nbytes for b in self.layouts) / GIB,
            "rollout/sync_tensors": float(loaded),
        }
        if verify:
            metrics.update(self.verify("in-process weight sync"))
            if before is not None:
                require_changed(before, self.engine.fingerprint(), version != self.synced_version, "in-process weight sync")
        self.synced_version = version
        return metrics

    def verify(self, where: str) -> dict[str, float]:
        """Probe log-probs of engine vs actor (an FSDP collective: every rank runs it)."""
        probe = probe_sequences(self.actor.module.config.vocab_size)
        check = compare_log_probs(
            trainer_log_probs(self.actor.module, probe, self.actor.device),
            self.engine.prompt_log_probs(probe),
            sync_tolerance(self.cfg, self.dtype),
        )
        require_match(check, where)
        return check.metrics()

    def generate(
        self,
        prompts: dict[str, torch.Tensor],
        params: Any,
        call_seed: int | None,
        rank: int,
        version: int,
        after_sync: Callable[[], None] | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Wake, sync if needed, run `after_sync` (e.g. offload the actor's parameters so the engine has
        the memory), generate, sleep."""
        released = self.engine.wake_up()
        metrics = self.sync(version, force=released)
        if after_sync is not None:
            after_sync()
        start = time.perf_counter()
        result = self.engine.generate(prompts, params, call_seed, rank)
        metrics["rollout/generate_s"] = time.perf_counter() - start
        self.engine.sleep()
        return result, metrics
