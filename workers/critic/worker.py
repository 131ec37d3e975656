"""`CriticWorker`: a token-level value model trained on returns, on either training backend (`critic.strategy`:
fsdp, megatron).

Its methods are written once on the `TrainBackend` protocol (workers/training/); the backend's side builds the
value model (FSDP: HF token classification with one label, workers/fsdp/critic_side.py; Megatron: a GPT with a
value head, workers/megatron/critic_side.py) and keeps its state where each phase needs it. Value and update
methods split the batch over the data-parallel ranks only (workers/training/mesh.py).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from workers.cached_blocks import set_release_point
from workers.config import critic_config
from workers.training.backend import ResponseOutputs, TrainBackend
from workers.training.batch_keys import require_batch_keys
from workers.training.checkpoint_methods import CheckpointMethods
from workers.training.dist_utils import check_same_length
from workers.training.forward_pass import forward_rows
from workers.training.mesh import METRICS_OVER_DATA_PARALLEL, OVER_DATA_PARALLEL
from workers.training.micro_batching import MicroBatching
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates
from workers.training.side import TrainedSide
from workers.training.value_loss import UPDATE_KEYS, VALUE_FORWARD, VALUE_KEYS, masked_values, value_loss


class CriticSide(TrainedSide, Protocol):
    """What the critic worker asks of its backend's side; the trained model is the critic."""

    critic: TrainBackend

    def export_hf(self, path: str) -> None: ...


def _side_class(strategy: str) -> type:
    """The backend's side, imported only for the backend in use (megatron-core is an optional extra)."""
    if strategy == "megatron":
        from workers.megatron.critic_side import MegatronCriticSide

        return MegatronCriticSide
    from workers.fsdp.critic_side import FSDPCriticSide

    return FSDPCriticSide


class CriticWorker(CheckpointMethods, Worker):
    checkpoint_phase_prefix = "critic_"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = critic_config(config)
        self.side: CriticSide | None = None  # built by init_model
        self.update_calls = 0
        # `offload/<phase>/...` of the phases since the last update, returned with the update's metrics
        self.offload_metrics: dict[str, float] = {}

    @property
    def critic(self) -> TrainBackend | None:
        return None if self.side is None else self.side.critic

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group()
        set_release_point(self.config["release_cached_blocks"])
        self.side = _side_class(self.config["strategy"])(self)
        self._end_phase("critic_init")

    def _resident(self, method: str, with_optimizer: bool = False) -> TrainBackend:
        """The critic, about to compute, its state on the device (its optimizer state only if asked: else for
        each optimizer step)."""
        if self.side is None:
            raise RuntimeError(f"{method}: call init_model() first")
        self.side.trained_needed(with_optimizer)
        return self.side.critic

    def _end_phase(self, phase: str) -> None:
        """The phase's offload metrics wait for the next update's, summed over the calls since."""
        for key, value in self.side.end_phase(phase).items():
            self.offload_metrics[key] = self.offload_metrics.get(key, 0.0) + value

    @register(OVER_DATA_PARALLEL)
    def compute_values(self, data: DataProto) -> DataProto | None:
        """`values` [B, R]: the value of the state before each response token, 0 outside the response (None on
        a rank that holds no outputs: Megatron's earlier pipeline stages)."""
        engine = self._resident("compute_values")
        require_batch_keys(data, VALUE_KEYS, "compute_values")
        check_same_length(len(data), engine.device, "compute_values")
        cfg = self.config
        batching = MicroBatching.for_call(
            data.meta_info,
            cfg["forward_micro_batch_size_per_gpu"],
            cfg["use_dynamic_bsz"],
            cfg["forward_max_token_len_per_gpu"],
            "critic.forward_max_token_len_per_gpu",
            self.side.sequence_parallel,
        )
        values = forward_rows(engine, data, batching, VALUE_FORWARD, masked_values)
        self._end_phase("values")
        return None if values is None else DataProto.from_dict(values)

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss updates toward `returns`; metrics averaged over micro-batches and ranks."""
        engine = self._resident("update_critic")
        cfg = self.config
        require_batch_keys(data, UPDATE_KEYS, "update_critic")

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return value_loss(outputs, micro, cfg)

        side = self.side
        schedule = PPOSchedule.from_config(
            cfg, cfg["rollout_n"], side.data_parallel_size, side.where("critic"), cfg["seed"], self.update_calls,
            side.sequence_parallel,
        )
        metrics = run_ppo_updates(engine, data, VALUE_FORWARD, loss_fn, schedule, "update_critic")
        self.update_calls += 1
        self._end_phase("update_critic")
        if metrics:  # the ranks that report outputs carry the offload figures too
            metrics.update(self.offload_metrics)
        self.offload_metrics = {}
        return metrics

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """Write the value model as an HF checkpoint (rank 0 writes), where the backend has an HF form."""
        self._resident("export_hf")
        self.side.export_hf(path)
        self._end_phase("critic_export_hf")
