"""The strategy's inference engine: one in-process engine per group of `group_size` strategy ranks.

The engine lives on the first rank of its group. `gather_and_generate` gathers every group member's
prompts to that rank, generates them in one call and hands each member its own results back in order.
`update` streams the trained weights into the engine (every rank takes part in the gathers; the engine
rank loads them) and checks them: the engine must score a fixed probe batch as the trained model does,
and its weights must have changed when the model was stepped since the last update.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from workers.rollout.buckets import BucketLayout
from workers.rollout.hybrid import WeightSource
from workers.rollout.verify import DEFAULT_TOLERANCE, WeightSyncMismatch, probe_sequences
from workers.strategy.config import ENGINE_TYPES, InferenceConfig

GIB = float(1 << 30)


def engine_groups(world_size: int, group_size: int) -> list[list[int]]:
    if world_size % group_size:
        raise ValueError(
            f"inference group_size={group_size} must divide the strategy's {world_size} ranks "
            f"(valid: {[s for s in range(1, world_size + 1) if world_size % s == 0]})"
        )
    return [list(range(start, start + group_size)) for start in range(0, world_size, group_size)]


def build_engine(engine_type: str, cfg: InferenceConfig, dtype: torch.dtype, device: torch.device, seed: int) -> Any:
    if engine_type == "vllm":
        if cfg.group_size != 1:
            # An in-process vLLM engine builds its groups over the default process group: every rank has to
            # take part, so every rank holds an engine.
            raise ValueError(
                f"engine_type 'vllm' needs inference group_size=1 (one engine per rank), got {cfg.group_size}; "
                "group_size > 1 is available with engine_type 'hf'"
            )
        from workers.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(cfg.model_path, cfg.vllm_rollout_options(), dtype, device, seed)
    if engine_type == "hf":
        from workers.strategy.hf_engine import HFGenerateEngine

        return HFGenerateEngine(cfg.model_path, dtype, device, cfg.enable_sleep)
    raise ValueError(f"engine_type {engine_type!r} is not available; valid: {list(ENGINE_TYPES)}")


class GroupedInferenceEngine:
    def __init__(
        self, cfg: InferenceConfig, engine_type: str, dtype: torch.dtype, device: torch.device, seed: int
    ) -> None:
        self.cfg, self.dtype = cfg, dtype
        rank, world = dist.get_rank(), dist.get_world_size()
        self.members: list[int] = []
        self.group: Any = None
        for members in engine_groups(world, cfg.group_size):
            group = dist.new_group(members) if cfg.group_size > 1 else None  # every rank creates every group
            if rank in members:
                self.members, self.group = members, group
        self.owner = self.members[0]
        self.engine = build_engine(engine_type, cfg, dtype, device, seed + rank) if rank == self.owner else None
        self.layouts: list[BucketLayout] | None = None
        self.needs_weights = False  # set when a wake-up finds the weights were discarded by sleep
        self.synced_version = 0  # the engine starts from the folder the model was loaded from

    @property
    def owns_engine(self) -> bool:
        return self.engine is not None

    # ---- generation -----------------------------------------------------------------------------------
    def gather_and_generate(self, prompts: list[list[int]], sampling: dict[str, Any]) -> list[dict[str, list]]:
        if self.owns_engine and (self.engine.asleep or self.needs_weights):
            state = "asleep" if self.engine.asleep else "awake without weights (sleep released them)"
            raise RuntimeError(
                f"gather_and_generate: the inference engine is {state}; call wakeup_inference_engine() and then "
                "update_engine_weights(model) first"
            )
        prompts = [list(map(int, p)) for p in prompts]
        if self.group is None:
            return self.engine.generate_token_lists(prompts, sampling)
        gathered: list[Any] = [None] * len(self.members)
        dist.all_gather_object(gathered, prompts, group=self.group)
        parts: list[Any] = [None]
        if self.owns_engine:
            results = self.engine.generate_token_lists([p for member in gathered for p in member], sampling)
            bounds = [0]
            for member in gathered:
                bounds.append(bounds[-1] + len(member))
            parts = [[results[bounds[i]:bounds[i + 1]] for i in range(len(gathered))]]
        dist.broadcast_object_list(parts, src=self.owner, group=self.group)
        return parts[0][self.members.index(dist.get_rank())]

    # ---- residency ------------------------------------------------------------------------------------
    def wake_up(self) -> None:
        if self.owns_engine and self.engine.wake_up():
            self.needs_weights = True

    def sleep(self) -> None:
        if self.owns_engine:
            self.engine.sleep()

    # ---- weights --------------------------------------------------------------------------------------
    def update(self, source: WeightSource, version: int) -> dict[str, float]:
        """Load `source`'s current weights into the engine and verify them. Collective over all ranks."""
        if self.owns_engine and self.engine.asleep:
            raise RuntimeError(
                "update_engine_weights: the inference engine is asleep; call wakeup_inference_engine() first"
            )
        if self.layouts is None:
            self.layouts = source.sync_layouts(self.dtype, self.cfg.bucket_mb << 20)
        check_changed = self.cfg.verify and version != self.synced_version and not self.needs_weights
        before = self.engine.fingerprint() if check_changed and self.owns_engine else None
        start = time.perf_counter()
        pairs = source.named_weights(self.layouts)
        if self.owns_engine:
            loaded = self.engine.load_weights(pairs)
        else:
            loaded = sum(1 for _ in pairs)  # the gathers are collectives: every rank walks the stream
        metrics = {
            "engine/sync_s": time.perf_counter() - start,
            "engine/sync_gib": sum(b.nbytes for b in self.layouts) / GIB,
            "engine/sync_tensors": float(loaded),
        }
        if self.cfg.verify:
            unchanged = before is not None and self.engine.fingerprint() == before
            metrics.update(self._verify(source, unchanged))
        self.synced_version, self.needs_weights = version, False
        return metrics

    def _verify(self, source: WeightSource, unchanged: bool) -> dict[str, float]:
        """Every rank raises the same error (a rank failing alone would leave the others in a collective)."""
        probe = probe_sequences(source.vocab_size)
        trainer = source.probe_log_probs(probe)  # a collective: every rank runs it
        report = torch.zeros(3, dtype=torch.float64)  # max diff, mean diff, engine weights unchanged
        if self.owns_engine:
            diff = (trainer.float() - self.engine.prompt_log_probs(probe).float()).abs()
            report = torch.tensor([diff.max().item(), diff.mean().item(), float(unchanged)], dtype=torch.float64)
        report = report.to(source.device)
        dist.all_reduce(report, op=dist.ReduceOp.MAX)
        max_diff, mean_diff, any_unchanged = report.tolist()
        tolerance = self.cfg.verify_tolerance or DEFAULT_TOLERANCE[self.dtype]
        if max_diff > tolerance:
            raise WeightSyncMismatch(
                f"update_engine_weights: the inference engine's log-probs of the probe batch differ from the model's "
                f"by up to {max_diff:.3g} (mean over engines up to {mean_diff:.3g}), above the tolerance "
                f"{tolerance:g}; weights were lost or mis-mapped (names, dtype, tied embeddings). The inference "
                "config's verify_tolerance sets the bound"
            )
        if any_unchanged:
            raise WeightSyncMismatch(
                "update_engine_weights: the model was stepped since the last update but the engine's weights did "
                "not change; the update loaded nothing"
            )
        return {"engine/sync_logprob_max_diff": max_diff, "engine/sync_logprob_mean_diff": mean_diff}
