"""`ActorRolloutRefWorker`: the policy (trained with PPO, SFT or DPO), its rollout and the frozen reference, on
either training backend (`actor.strategy`: fsdp, megatron).

Roles:
    "actor_rollout"      the trainable policy; generates and computes its own log-probs
    "actor_rollout_ref"  the same, plus the frozen initial policy for ref log-probs
    "ref"                only the frozen reference policy

Every method is written once here on the `TrainBackend` protocol (workers/training/); the backend's side
(workers/actor/side.py) builds the models and the rollout and keeps their state where each phase needs it.
Log-prob and update methods split the batch over the data-parallel ranks only (FSDP with Ulysses: W/k groups of
k ranks sharing each row; Megatron: the DP groups of its TP x PP mesh); generation splits prompts over all ranks.
With LoRA (`model.lora_rank` > 0, FSDP) the reference is the actor's base: its forward with the adapters off.
"""

from __future__ import annotations

from typing import Any

import torch

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from workers.actor.side import ActorSide
from workers.cached_blocks import set_release_point
from workers.config import actor_rollout_ref_config
from workers.memory import MemoryLog
from workers.rl_math.rollout_correction import OLD_LOG_PROBS
from workers.rollout.in_process_sync import WeightSource
from workers.rollout.shaping import rollout_output
from workers.rollout.weight_sender import WeightSenderMixin
from workers.routing_replay.passes import log_prob_pass_mode, routing_pass, update_pass_mode
from workers.routing_replay.token_order import ROUTED_EXPERTS
from workers.training.actor_loss import actor_forward, actor_loss, required_update_keys
from workers.training.backend import ResponseForward, ResponseOutputs, TrainBackend
from workers.training.batch_keys import require_batch_keys
from workers.training.checkpoint_methods import CheckpointMethods
from workers.training.dist_utils import check_same_length
from workers.training.dpo_update import PAIR_KEYS, DPOSettings, run_dpo_update
from workers.training.forward_pass import forward_rows, response_log_probs
from workers.training.mesh import METRICS_OVER_DATA_PARALLEL, OVER_DATA_PARALLEL
from workers.training.micro_batching import MicroBatching
from workers.training.ppo_loop import PPOSchedule, check_one_optimizer_step, run_ppo_updates
from workers.training.sft_update import SFT_KEYS, sft_loss_from_log_probs, with_loss_mask

ROLES = ("actor_rollout", "actor_rollout_ref", "ref")
PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
LOG_PROB_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def _side_class(strategy: str) -> type:
    """The backend's side, imported only for the backend in use (megatron-core is an optional extra)."""
    if strategy == "megatron":
        from workers.megatron.actor_side import MegatronActorSide

        return MegatronActorSide
    from workers.fsdp.actor_side import FSDPActorSide

    return FSDPActorSide


class ActorRolloutRefWorker(CheckpointMethods, WeightSenderMixin, Worker):
    def __init__(self, config: dict[str, Any], role: str) -> None:
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; valid roles: {list(ROLES)}")
        self.role = role
        self.config = actor_rollout_ref_config(config)
        self.side: ActorSide | None = None  # built by init_model
        self.update_calls = 0  # part of the checkpoint: seeds the mini-batch shuffles
        self.weights_version = 0  # bumped whenever the actor's weights change (update, checkpoint load)
        self.step_metrics: dict[str, float] = {}
        self.memory: MemoryLog | None = None

    # The side's models and rollout, under the names worker code and tests reach for.
    @property
    def actor(self) -> TrainBackend | None:
        return None if self.side is None else self.side.actor

    @property
    def ref(self) -> TrainBackend | None:
        return None if self.side is None else self.side.ref

    @property
    def hybrid_rollout(self) -> Any:
        return None if self.side is None else self.side.hybrid_rollout

    def close(self) -> None:
        """The hybrid engine shut down before the worker is killed (Worker.close)."""
        if self.hybrid_rollout is not None:
            self.hybrid_rollout.close()

    # ---- setup ----------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group()
        cfg = self.config
        set_release_point(cfg["release_cached_blocks"])
        self.side = _side_class(cfg["actor"]["strategy"])(self)
        self.step_metrics.update(self.side.start_metrics)
        self.memory = MemoryLog((self.actor or self.ref).device)
        self._end_phase("init")
        torch.manual_seed(cfg["seed"] + self.rank)  # each rank samples from its own stream, reproducibly

    def _engine(self, which: str, method: str) -> TrainBackend:
        engine = self.actor if which == "actor" else self.ref
        if engine is None:
            if self.side is None:
                raise RuntimeError(f"{method}: call init_model() first")
            raise RuntimeError(f"{method} needs the {which} model, which role {self.role!r} does not have")
        return engine

    def _resident(self, method: str, with_optimizer: bool = False) -> TrainBackend:
        """The actor with its parameters (and optimizer state if asked) on the device."""
        engine = self._engine("actor", method)
        self.side.trained_needed(with_optimizer)
        return engine

    def _sync_source(self) -> WeightSource:
        self._resident("broadcast_weights")
        return self.side.weight_source()

    def _end_phase(self, phase: str) -> None:
        """The phase's offload traffic and memory reading."""
        self.step_metrics.update(self.side.end_phase(phase))
        self.memory.record(phase)

    @register(Dispatch.RANK_ZERO)
    def current_weights_version(self) -> int:
        """Counts the changes of the actor's weights (updates, checkpoint loads): a sync is due when it moved."""
        return self.weights_version

    @register(Dispatch.ONE_TO_ALL)
    def pop_step_metrics(self) -> dict[str, float]:
        """Metrics gathered on this rank since the last call: weight sync, engine timings, memory per phase."""
        metrics, self.step_metrics = {**self.step_metrics, **(self.memory.pop() if self.memory else {})}, {}
        return metrics

    # ---- rollout --------------------------------------------------------------------------------------
    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Left-padded prompts [B, P] -> prompts, responses [B, R], input_ids / attention_mask /
        position_ids [B, P+R], response_mask [B, R]; other keys and meta_info of the input carried over."""
        if self.config["rollout"]["placement"] == "separate":
            raise RuntimeError(
                "rollout.placement='separate': generate_sequences runs on the rollout worker group, not the actor"
            )
        engine = self._engine("actor", "generate_sequences")
        require_batch_keys(prompts, PROMPT_KEYS, "generate_sequences")
        check_same_length(len(prompts), engine.device, "generate_sequences")
        result, metrics = self.side.generate(prompts, self.weights_version)
        self.step_metrics.update(metrics)
        self._end_phase("generate")
        return rollout_output(prompts, result)

    @register(Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> dict[str, float]:
        """Load the actor's current weights into this rank's rollout now (generate_sequences also does it when
        they are stale); returns sync metrics ({} when already current or loaded at the next generate)."""
        self._engine("actor", "sync_rollout_weights")
        metrics = self.side.sync_rollout_weights(self.weights_version)
        if metrics is None:
            return {}
        self._end_phase("sync")
        return metrics

    # ---- log-probs ------------------------------------------------------------------------------------
    def _log_probs(
        self, engine: TrainBackend, data: DataProto, section: str, with_entropy: bool, method: str
    ) -> dict[str, torch.Tensor] | None:
        """{"log_probs", "entropy" (with_entropy)} [B, R], micro-batched as config section `section` says;
        None on a rank that holds no outputs (Megatron's earlier pipeline stages)."""
        require_batch_keys(data, LOG_PROB_KEYS, method)
        check_same_length(len(data), engine.device, method)
        data = self.side.with_images(data, method)
        temperature = float(data.meta_info.get("temperature", self.config["rollout"]["temperature"]))
        cfg = self.config[section]
        batching = MicroBatching.for_call(
            data.meta_info,
            cfg["log_prob_micro_batch_size_per_gpu"],
            cfg["log_prob_use_dynamic_bsz"],
            cfg["log_prob_max_token_len_per_gpu"],
            f"{section}.log_prob_max_token_len_per_gpu",
            self.side.sequence_parallel,
        )
        forward = ResponseForward("log_probs", temperature, with_entropy)
        return forward_rows(engine, data, batching, forward, response_log_probs)

    @register(OVER_DATA_PARALLEL)
    def compute_log_prob(self, data: DataProto) -> DataProto | None:
        """Actor log-probs of the responses: `old_log_probs` [B, R] and `entropys` [B, R]."""
        engine = self._resident("compute_log_prob")
        mode = log_prob_pass_mode(self.config)
        with routing_pass(engine.routing, mode, data, "compute_log_prob", self.step_metrics, "log_prob"):
            out = self._log_probs(engine, data, "rollout", True, "compute_log_prob")
        self._end_phase("old_log_prob")
        if out is None:
            return None
        # Routing replay R2: the experts this pass chose, replayed by the update.
        recorded = {ROUTED_EXPERTS: out[ROUTED_EXPERTS]} if ROUTED_EXPERTS in out else {}
        return DataProto.from_dict({"old_log_probs": out["log_probs"], "entropys": out["entropy"], **recorded})

    @register(OVER_DATA_PARALLEL)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto | None:
        """Reference-policy log-probs of the responses: `ref_log_prob` [B, R]. With LoRA the reference is the
        actor's base model: the same forward with every adapter disabled."""
        with self.side.reference("compute_ref_log_prob") as engine:
            out = self._log_probs(engine, data, "ref", False, "compute_ref_log_prob")
        self._end_phase("ref_log_prob")
        return None if out is None else DataProto.from_dict({"ref_log_prob": out["log_probs"]})

    # ---- training -------------------------------------------------------------------------------------
    def _update_schedule(self) -> PPOSchedule:
        """Epochs x mini-batches x micro-batches of an update, over the data-parallel ranks."""
        side = self.side
        n = self.config["rollout"]["n"]
        seed = self.config["seed"]
        return PPOSchedule.from_config(
            self.config["actor"], n, side.data_parallel_size, side.where("actor"), seed, self.update_calls,
            side.sequence_parallel,
        )

    def _updated(self, phase: str = "update_actor") -> None:
        """The weights changed: a sync is due, and the phase is over."""
        self.weights_version += 1
        self._end_phase(phase)

    _checkpoint_loaded = _updated  # a loaded checkpoint's weights: a sync is due

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO update on this rank's share; returns metrics averaged over micro-batches and ranks."""
        engine = self._resident("update_actor")  # the optimizer state comes for each step only
        actor_cfg = self.config["actor"]
        require_batch_keys(data, required_update_keys(actor_cfg, with_old_log_probs=False), "update_actor")
        schedule = self._update_schedule()
        if OLD_LOG_PROBS not in data.batch.keys():
            check_one_optimizer_step(schedule, len(data))  # this update's forward gives pi_old
        data = self.side.with_images(data, "update_actor")
        temperature = float(data.meta_info.get("temperature", self.config["rollout"]["temperature"]))
        is_cap = self.config["rollout"].get("tis_imp_ratio_cap")

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return actor_loss(outputs, micro, actor_cfg, is_cap)

        forward = actor_forward(actor_cfg, temperature)
        mode = update_pass_mode(self.config, data)
        with routing_pass(engine.routing, mode, data, "update_actor", self.step_metrics, "update"):
            metrics = run_ppo_updates(engine, data, forward, loss_fn, schedule, "update_actor")
        self.update_calls += 1
        self.side.after_update()
        self._updated()
        return metrics

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_actor_sft(self, data: DataProto) -> dict[str, float]:
        """Supervised step on the responses (token NLL under `response_mask` x optional `loss_mask`; layout
        in `workers/training/sft_update.py`) with the PPO update's schedule; log-probs at temperature 1 unless
        `meta_info["temperature"]` says otherwise. Returns `sft_loss`, `grad_norm`, `lr` over micro-batches and
        ranks."""
        engine = self._resident("update_actor_sft")
        require_batch_keys(data, SFT_KEYS, "update_actor_sft")
        loss_agg_mode = self.config["actor"]["loss_agg_mode"]

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return sft_loss_from_log_probs(outputs.log_probs, micro, outputs.device, loss_agg_mode)

        forward = ResponseForward("log_probs", float(data.meta_info.get("temperature", 1.0)))
        schedule = self._update_schedule()
        metrics = run_ppo_updates(engine, with_loss_mask(data), forward, loss_fn, schedule, "update_actor_sft")
        self.update_calls += 1
        self._updated()
        return metrics

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_actor_dpo(self, pairs: DataProto) -> dict[str, float]:
        """DPO update on preference pairs packed one per row (layout in `workers/training/dpo_update.py`); the
        loss settings come in `meta_info["dpo"]` ({beta, loss_type, label_smoothing, epochs}). Log-probs use
        the same temperature rule as `compute_ref_log_prob`, so policy and reference are comparable.
        Generation runs on this same model, so the next `generate_sequences` samples from the new weights."""
        engine = self._resident("update_actor_dpo")
        require_batch_keys(pairs, PAIR_KEYS, "update_actor_dpo")
        actor_cfg = self.config["actor"]
        metrics = run_dpo_update(
            engine,
            pairs,
            DPOSettings.from_meta(pairs.meta_info.get("dpo")),
            micro_batch_size=int(pairs.meta_info.get("micro_batch_size", actor_cfg["ppo_micro_batch_size_per_gpu"])),
            grad_clip=actor_cfg["grad_clip"],
            temperature=float(pairs.meta_info.get("temperature", self.config["rollout"]["temperature"])),
        )
        self._updated()
        return metrics

    # ---- export (checkpoints: workers/training/checkpoint_methods.py) -----------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """Write the actor (the ref for role "ref") as an HF checkpoint; rank 0 writes, all ranks gather."""
        if self.actor is not None:
            self._resident("export_hf").export_hf(path)
            self._end_phase("export_hf")
        else:
            with self.side.reference("export_hf") as engine:
                engine.export_hf(path)
