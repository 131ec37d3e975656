"""A `MegatronBackend` as the weight source of a hybrid vLLM engine (see workers/rollout/hybrid.py) and of the
broadcast to separate engines (workers/rollout/weight_sender.py)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from protocol import DataProto
from workers.megatron.backend import MegatronBackend
from workers.megatron.export import hf_stream_specs
from workers.megatron.vocab_parallel import log_probs_and_entropy
from workers.moe_config import model_has_experts
from workers.rollout.buckets import BucketLayout, plan_buckets
from workers.rollout.weight_sync import WeightBuckets, stream_buckets


class MegatronWeightSource:
    """Weights leave as whole HF tensors (TP-gathered, PP-broadcast), so every rank's engine gets them all."""

    def __init__(self, engine: MegatronBackend) -> None:
        self.engine = engine
        self.model_path, self.device, self.dtype = engine.model_path, engine.device, engine.dtype
        self.config_overrides = engine.config_overrides
        self.vocab_size = engine.layout.vocab_size
        self.experts = model_has_experts(engine.hf_config)
        self.lora = None  # the Megatron backend trains every weight

    def sync_layouts(self, dtype: torch.dtype, bucket_bytes: int) -> list[BucketLayout]:
        """Planned in the order the weights stream out (per-expert names), so a broadcast fills bucket after
        bucket without holding tensors back."""
        specs = hf_stream_specs(self.engine.layout, self.engine.settings.pp)
        return plan_buckets(((name, shape, dtype) for name, shape in specs), bucket_bytes)

    def named_weights(self, layouts: list[BucketLayout]) -> Iterator[tuple[str, torch.Tensor]]:
        dtype = layouts[0].slots[0].dtype if layouts and layouts[0].slots else self.dtype
        return self.engine.hf_weights(dtype)

    def buckets(self, layouts: list[BucketLayout], cast: bool = True) -> WeightBuckets:
        return stream_buckets(self.named_weights(layouts), layouts)  # streamed in the layouts' dtype already

    def probe_log_probs(self, probe: torch.Tensor) -> torch.Tensor:
        """Computed on the last pipeline stage, then broadcast to the other stages."""
        from megatron.core import parallel_state as ps

        batch = DataProto.from_dict({"input_ids": probe, "attention_mask": torch.ones_like(probe)})
        targets = probe[:, 1:].to(self.device)

        def keep(output: torch.Tensor, micro: DataProto) -> tuple[torch.Tensor, dict]:
            log_probs, _ = log_probs_and_entropy(output[:, :-1], targets, self.vocab_size, with_entropy=False)
            return output.new_zeros(()), {"log_probs": log_probs}

        kept = self.engine.run_micro_batches([batch], keep, forward_only=True)
        if kept:
            result = kept[0]["log_probs"].contiguous()
        else:
            result = torch.empty(targets.shape, dtype=torch.float32, device=self.device)
        if ps.get_pipeline_model_parallel_world_size() > 1:
            group = ps.get_pipeline_model_parallel_group()
            dist.broadcast(result, src=dist.get_process_group_ranks(group)[-1], group=group)
        return result.cpu()
