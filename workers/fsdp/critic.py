"""`CriticWorker`: a token-level value model (HF token classification, one label) trained on returns.

With `ulysses_sequence_parallel_size` k > 1 its methods split the batch over W/k data-parallel groups of k
ranks sharing each packed sequence (workers/fsdp/ulysses.py). With `model.fsdp_config.param_offload` /
`optimizer_offload` its state leaves the GPU as the actor's does (workers/fsdp/residency.py `CriticResidency`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForTokenClassification

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from workers.cached_blocks import set_release_point
from workers.config import critic_config, mini_batch_per_rank
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.offload import GIB, Offloader
from workers.fsdp.residency import CriticResidency, process_tenants
from workers.fsdp.ulysses import SequenceLayout, init_sequence_layout
from workers.training.backend import ResponseOutputs
from workers.training.batch_keys import require_batch_keys
from workers.training.dist_utils import check_same_length
from workers.training.forward_pass import forward_rows
from workers.training.mesh import METRICS_OVER_DATA_PARALLEL, OVER_DATA_PARALLEL
from workers.training.micro_batching import MicroBatching
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates
from workers.training.value_loss import (
    UPDATE_KEYS,
    VALUE_FORWARD,
    VALUE_KEYS,
    masked_values,
    value_loss,
)


class CriticWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = critic_config(config)
        self.critic: FSDPBackend | None = None
        self.layout: SequenceLayout | None = None
        self.residency: CriticResidency | None = None
        self.update_calls = 0
        # `offload/<phase>/...` of the phases since the last update, returned with the update's metrics
        self.offload_metrics: dict[str, float] = {}

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group()
        set_release_point(self.config["release_cached_blocks"])
        cfg = self.config
        setting = "critic.ulysses_sequence_parallel_size"
        self.layout = init_sequence_layout(self, cfg["ulysses_sequence_parallel_size"], setting)
        mini_batch_per_rank(cfg, cfg["rollout_n"], self.layout.dp_size, self.layout.where("critic"))
        # num_labels=1: one value per token. The head is new (seeded, so equal on all ranks); no dropout
        # on it, or values in training would not match the values the advantages were computed from.
        self.critic = FSDPBackend(
            AutoModelForTokenClassification,
            cfg["model"],
            self.rank,
            optim_cfg=cfg["optim"],
            config_overrides={"num_labels": 1, "classifier_dropout": 0.0},
            seed=cfg["seed"],
            sequence_parallel=self.layout.group,
            sequence_parallel_setting=setting,
        )
        offload = cfg["model"]["fsdp_config"]
        critic = self.critic
        offloader = Offloader(
            critic.module, critic.optimizer, critic.device, offload["param_offload"], offload["optimizer_offload"]
        )
        self.residency = CriticResidency(offloader, process_tenants())
        self.residency.after_start()
        self._end_phase("critic_init")

    def _engine(self, method: str, with_optimizer: bool = False) -> FSDPBackend:
        """The critic, about to compute: a colocated actor's offloadable state leaves the GPU first, the
        critic's own comes in (its optimizer state only if asked: else for each optimizer step)."""
        if self.critic is None:
            raise RuntimeError(f"{method}: call init_model() first")
        self.residency.critic_needed(with_optimizer)
        return self.critic

    def _end_phase(self, phase: str) -> None:
        """Only optimizer state a checkpoint brought leaves here: the parameters stay until another tenant
        claims the GPU. The phase's offload metrics wait for the next update's, summed over the calls since."""
        metrics = self.residency.end_phase(phase)
        for key, value in metrics.items():
            self.offload_metrics[key] = self.offload_metrics.get(key, 0.0) + value
        if metrics:
            self.offload_metrics["offload/critic_host_buffers_gib"] = self.residency.critic.host_bytes / GIB

    @register(OVER_DATA_PARALLEL)
    def compute_values(self, data: DataProto) -> DataProto:
        """`values` [B, R]: the value of the state before each response token, 0 outside the response."""
        engine = self._engine("compute_values")
        require_batch_keys(data, VALUE_KEYS, "compute_values")
        check_same_length(len(data), engine.device, "compute_values")
        cfg = self.config
        batching = MicroBatching.for_call(
            data.meta_info, cfg["forward_micro_batch_size_per_gpu"], cfg["use_dynamic_bsz"],
            cfg["forward_max_token_len_per_gpu"], "critic.forward_max_token_len_per_gpu", self.layout.size,
        )

        values = DataProto.from_dict(forward_rows(engine, data, batching, VALUE_FORWARD, masked_values))
        self._end_phase("values")
        return values

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss updates toward `returns`; metrics averaged over micro-batches and ranks."""
        engine = self._engine("update_critic")
        cfg = self.config
        require_batch_keys(data, UPDATE_KEYS, "update_critic")

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return value_loss(outputs, micro, cfg)

        layout = self.layout
        where = layout.where("critic")
        schedule = PPOSchedule.from_config(
            cfg, cfg["rollout_n"], layout.dp_size, where, cfg["seed"], self.update_calls, layout.size
        )
        metrics = run_ppo_updates(engine, data, VALUE_FORWARD, loss_fn, schedule, "update_critic")
        self.update_calls += 1
        self._end_phase("update_critic")
        metrics.update(self.offload_metrics)
        self.offload_metrics = {}
        return metrics

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        engine = self._engine("save_checkpoint", with_optimizer=True)
        with self.residency.optimizer_held():
            engine.save_checkpoint(path, {"update_calls": self.update_calls})
        self._end_phase("critic_save_checkpoint")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        engine = self._engine("load_checkpoint", with_optimizer=True)
        with self.residency.optimizer_held():  # the load may create the optimizer's state with a step
            extra = engine.load_checkpoint(path)
        self.update_calls = int(extra["update_calls"])
        self._end_phase("critic_load_checkpoint")

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """Write the value model as an HF token-classification checkpoint (rank 0 writes)."""
        self._engine("export_hf").export_hf(path)
        self._end_phase("critic_export_hf")
