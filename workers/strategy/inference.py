"""The strategy's inference engine: one in-process engine per group of `group_size` strategy ranks.

The engine lives on the first rank of its group. `gather_and_generate` gathers every group member's
prompts to that rank, generates them in one call and hands each member its own results back in order.
`update` streams the trained weights into the engine and checks them, through the hybrid rollout's
in-process sync (workers/rollout/in_process_sync.py): every rank takes part in the gathers, the engine rank
loads them, and every rank raises the same error when a check fails.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist

from workers.rollout.engine_group import engine_group, sleep_engine
from workers.rollout.in_process_sync import InProcessSync, WeightSource
from workers.strategy.config import InferenceConfig


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
    from workers.rollout.hf_engine import HFGenerateEngine  # "hf" (setup_inference_engine checked the name)

    return HFGenerateEngine(cfg.model_path, dtype, device, cfg.enable_sleep)


class GroupedInferenceEngine:
    def __init__(
        self, cfg: InferenceConfig, engine_type: str, dtype: torch.dtype, device: torch.device, seed: int
    ) -> None:
        self.cfg, self.dtype = cfg, dtype
        rank = dist.get_rank()
        engine_groups(dist.get_world_size(), cfg.group_size)  # names the valid sizes when group_size does not divide
        self.group = engine_group(cfg.group_size, device)  # the hybrid rollout's groups; None: an engine of its own
        owns = self.group is None or self.group.is_leader
        self.engine = build_engine(engine_type, cfg, dtype, device, seed + rank) if owns else None
        self.sync: InProcessSync | None = None  # made at the first update, from the model's weight layout
        self.needs_weights = False  # set when a wake-up finds the weights were discarded by sleep

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
        gathered = self.group.gather(prompts)
        parts = None
        if self.owns_engine:
            results = iter(self.engine.generate_token_lists([p for member in gathered for p in member], sampling))
            parts = [list(itertools.islice(results, len(member))) for member in gathered]
        return self.group.scatter(parts)

    # ---- residency ------------------------------------------------------------------------------------
    def wake_up(self) -> None:
        if self.owns_engine and self.engine.wake_up():
            self.needs_weights = True

    def sleep(self) -> None:
        sleep_engine(self.engine, self.group)

    # ---- weights --------------------------------------------------------------------------------------
    def update(self, source: WeightSource) -> dict[str, float]:
        """Load `source`'s current weights into the engine and verify them (with `verify`: the probe batch, and
        the engine's weights change exactly when the model's did since the last update). Collective over all
        ranks; returns `rollout/sync_*` metrics."""
        if self.owns_engine and self.engine.asleep:
            raise RuntimeError(
                "update_engine_weights: the inference engine is asleep; call wakeup_inference_engine() first"
            )
        if self.sync is None:
            self.sync = InProcessSync(
                self.engine, source.sync_layouts(self.dtype, self.cfg.bucket_mb << 20), self.dtype, self.cfg.verify,
                self.cfg.verify_tolerance, "update_engine_weights", group=self.group, every_rank=True,
                tolerance_setting="the inference config's verify_tolerance", experts=source.experts,
            )
        metrics = self.sync.load(source, compare=not self.needs_weights)
        self.needs_weights = False
        return metrics
