"""`MegatronCriticWorker`: the FSDP critic's methods on a megatron-core GPT with a value head."""

from __future__ import annotations

from typing import Any

import torch

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from workers.config import critic_config, mini_batch_per_rank
from workers.megatron.backend import MegatronBackend
from workers.megatron.model import ParallelSettings
from workers.megatron.parallel import init_megatron_parallel
from workers.training.backend import ResponseOutputs
from workers.training.batch_keys import require_batch_keys
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


class MegatronCriticWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = critic_config(config)
        self.settings = ParallelSettings.from_config(self.config["megatron"])
        self.critic: MegatronBackend | None = None
        self.update_calls = 0

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        self.init_process_group()
        self.dp_size = init_megatron_parallel(self, self.settings.tp, self.settings.pp).dp_size
        mini_batch_per_rank(cfg, cfg["rollout_n"], self.dp_size, "critic (over data-parallel ranks)")
        # The value head is new: seeded, so it starts equal on every rank.
        self.critic = MegatronBackend(cfg["model"], self.settings, cfg["optim"], value_head=True, seed=cfg["seed"])

    def _engine(self, method: str) -> MegatronBackend:
        if self.critic is None:
            raise RuntimeError(f"{method}: call init_model() first")
        return self.critic

    @register(OVER_DATA_PARALLEL)
    def compute_values(self, data: DataProto) -> DataProto | None:
        """`values` [B, R]: the value of the state before each response token, 0 outside the response."""
        engine = self._engine("compute_values")
        require_batch_keys(data, VALUE_KEYS, "compute_values")
        micro_size = int(data.meta_info.get("micro_batch_size", self.config["forward_micro_batch_size_per_gpu"]))
        values = forward_rows(engine, data, MicroBatching(micro_size), VALUE_FORWARD, masked_values)
        return None if values is None else DataProto.from_dict(values)

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss updates toward `returns`; metrics on the last stage, reduced over data-parallel ranks."""
        engine = self._engine("update_critic")
        cfg = self.config
        require_batch_keys(data, UPDATE_KEYS, "update_critic")

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return value_loss(outputs, micro, cfg)

        where = "critic (over data-parallel ranks)"
        schedule = PPOSchedule.from_config(cfg, cfg["rollout_n"], self.dp_size, where, cfg["seed"], self.update_calls)
        metrics = run_ppo_updates(engine, data, VALUE_FORWARD, loss_fn, schedule, "update_critic")
        self.update_calls += 1
        return metrics

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self._engine("save_checkpoint").save_checkpoint(path, {"update_calls": self.update_calls})

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.update_calls = int(self._engine("load_checkpoint").load_checkpoint(path)["update_calls"])

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        raise NotImplementedError(
            "export_hf of a Megatron critic: the value head has no HF causal-LM form; use save_checkpoint "
            "(or critic.strategy=fsdp for an HF token-classification export)"
        )
