"""`RewardModelWorker`: a sequence-classification reward model scoring prompt+response token ids."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForSequenceClassification

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from workers.cached_blocks import set_release_point
from workers.config import reward_model_config
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.residency import REWARD_MODEL, process_tenants
from workers.fsdp.sequences import SEQUENCE_KEYS
from workers.rl_math.masked import last_valid_positions
from workers.training.backend import ResponseForward, ResponseOutputs
from workers.training.batch_keys import require_batch_keys, response_mask
from workers.training.dist_utils import check_same_length
from workers.training.forward_pass import forward_rows
from workers.training.micro_batching import MicroBatching

SCORE_KEYS = (*SEQUENCE_KEYS, "responses")


class RewardModelWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = reward_model_config(config)
        self.reward_model: FSDPBackend | None = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group()
        set_release_point(self.config["release_cached_blocks"])
        self.reward_model = FSDPBackend(
            AutoModelForSequenceClassification,
            self.config["model"],
            self.rank,
            config_overrides={"num_labels": 1},
            seed=self.config["seed"],
        )

    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` [B, R]: the model's score at the last valid response token, 0 elsewhere."""
        if self.reward_model is None:
            raise RuntimeError("compute_rm_score: call init_model() first")
        process_tenants().claim(REWARD_MODEL)  # a colocated actor's offloadable state leaves the GPU first
        engine = self.reward_model
        require_batch_keys(data, SCORE_KEYS, "compute_rm_score")
        check_same_length(len(data), engine.device, "compute_rm_score")
        cfg = self.config
        batching = MicroBatching.for_call(
            data.meta_info, cfg["micro_batch_size_per_gpu"], cfg["use_dynamic_bsz"],
            cfg["forward_max_token_len_per_gpu"], "reward_model.forward_max_token_len_per_gpu",
        )

        def keep(outputs: ResponseOutputs, micro: DataProto) -> dict[str, torch.Tensor]:
            scores = outputs.scores.cpu()
            # The score at each row's last valid response token (the mask may have holes: tool tokens).
            last = last_valid_positions(response_mask(micro)).clamp(min=0).cpu()[:, None]
            return {"rm_scores": torch.zeros_like(scores).scatter_(1, last, scores.gather(1, last))}

        return DataProto.from_dict(forward_rows(engine, data, batching, ResponseForward("scores"), keep))
