"""`MegatronActorRolloutRefWorker`: the FSDP actor/rollout/ref worker's methods on megatron-core models.

Same roles, methods, batch keys and metrics as `workers/fsdp/actor_rollout_ref.py`, so the PPO/GRPO and
online-DPO loops run unchanged with `actor.strategy=megatron`. Log-prob and update methods are dispatched
over the Megatron mesh: the data is split over DP only (all TP/PP ranks of a DP group get the same chunk)
and collected from TP rank 0 of the last pipeline stage. Every rank generates its share, with a vLLM
engine in its process (`rollout.name=vllm`) or an HF replica of the policy, either refreshed from the
Megatron weights (TP-gathered, PP-broadcast as whole HF tensors) whenever they changed.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from single_controller.mesh import MeshDispatch
from workers.actor_state import ActorStateMixin
from workers.config import actor_rollout_ref_config, mini_batch_per_rank
from workers.megatron.engine import MegatronEngine
from workers.megatron.model import ParallelSettings
from workers.megatron.parallel import MEGATRON_MESH, init_megatron_parallel
from workers.memory import MemoryLog
from workers.rollout.hf_generate import generate_responses, seeded_sampling
from workers.rollout.sampling import folder_token_ids, model_token_ids, sampling_params
from workers.rollout.shaping import rollout_output
from workers.training.actor_loss import actor_forward, actor_loss, required_update_keys
from workers.training.backend import ResponseForward, ResponseOutputs
from workers.training.batch_keys import require_batch_keys
from workers.training.dpo_update import PAIR_KEYS, DPOSettings, run_dpo_update
from workers.training.forward_pass import forward_rows, response_log_probs
from workers.training.micro_batching import MicroBatching
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates
from workers.training.sft_update import (
    SFT_KEYS,
    sft_loss_from_log_probs,
    with_loss_mask,
)

ROLES = ("actor_rollout", "actor_rollout_ref", "ref")
PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
LOG_PROB_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
OVER_DP = MeshDispatch(MEGATRON_MESH)
METRICS_OVER_DP = MeshDispatch(MEGATRON_MESH, outputs="list")


class MegatronActorRolloutRefWorker(ActorStateMixin, Worker):
    def __init__(self, config: dict[str, Any], role: str) -> None:
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; valid roles: {list(ROLES)}")
        self.role = role
        self.config = actor_rollout_ref_config(config)
        self.settings = ParallelSettings.from_config(self.config["actor"]["megatron"])
        self.actor: MegatronEngine | None = None
        self.ref: MegatronEngine | None = None
        self.rollout_model: torch.nn.Module | None = None  # HF generate (rollout.name=hf)
        self.hybrid_rollout = None  # a vLLM engine in this process (rollout.name=vllm)
        self.rollout_version = 0  # the weights version the HF replica holds
        self.update_calls = 0
        self.init_actor_state()

    # ---- setup ----------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        self.init_process_group()
        placement = init_megatron_parallel(self, self.settings.tp, self.settings.pp)
        self.dp_size = placement.dp_size
        max_positions = max(4096, cfg["rollout"]["max_model_len"] or 0)
        if self.role != "ref":
            mini_batch_per_rank(cfg["actor"], cfg["rollout"]["n"], self.dp_size, "actor (over data-parallel ranks)")
            self.actor = MegatronEngine(
                cfg["model"], self.settings, cfg["actor"]["optim"], seed=cfg["seed"], max_positions=max_positions
            )
            if cfg["rollout"]["name"] == "vllm":
                from workers.megatron.rollout_source import MegatronWeightSource
                from workers.rollout.engine_group import engine_group
                from workers.rollout.hybrid import HybridRollout

                group = engine_group(cfg["rollout"]["tensor_model_parallel_size"], self.actor.device)
                self.hybrid_rollout = HybridRollout(
                    MegatronWeightSource(self.actor), cfg["rollout"], seed=cfg["seed"] + self.rank, group=group
                )
            else:
                self.rollout_model = AutoModelForCausalLM.from_pretrained(
                    cfg["model"]["path"], dtype=self.actor.dtype
                ).to(self.actor.device)
                self.rollout_model.eval()
        if self.role in ("actor_rollout_ref", "ref"):
            self.ref = MegatronEngine(cfg["model"], self.settings, seed=cfg["seed"], max_positions=max_positions)
        self.memory = MemoryLog((self.actor or self.ref).device)
        self.memory.record("init")
        torch.manual_seed(cfg["seed"] + self.rank)

    def _engine(self, which: str, method: str) -> MegatronEngine:
        engine = self.actor if which == "actor" else self.ref
        if engine is None:
            if self.actor is None and self.ref is None:
                raise RuntimeError(f"{method}: call init_model() first")
            raise RuntimeError(f"{method} needs the {which} model, which role {self.role!r} does not have")
        return engine

    # ---- rollout --------------------------------------------------------------------------------------
    def _refresh_rollout_model(self) -> dict[str, float]:
        """Copy the actor's current weights into the HF replica (collective) unless it has them."""
        if self.rollout_version == self.weights_version:
            return {}
        start = time.perf_counter()
        params = dict(self.rollout_model.named_parameters())
        count = 0
        with torch.no_grad():
            for name, tensor in self._engine("actor", "sync_rollout_weights").hf_weights():
                params[name].copy_(tensor)
                count += 1
        self.rollout_version = self.weights_version
        return {"rollout/sync_s": time.perf_counter() - start, "rollout/sync_tensors": float(count)}

    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Same contract as the FSDP worker: every rank generates its share with its HF replica."""
        self._engine("actor", "generate_sequences")
        require_batch_keys(prompts, PROMPT_KEYS, "generate_sequences")
        seed = prompts.meta_info.get("seed")
        if self.hybrid_rollout is not None:
            eos, pad = folder_token_ids(self.actor.model_path)
            params = sampling_params(self.config["rollout"], prompts.meta_info, eos, pad)
            inputs = {k: prompts.batch[k] for k in PROMPT_KEYS}
            result, metrics = self.hybrid_rollout.generate(inputs, params, seed, self.rank, self.weights_version)
            self.step_metrics.update(metrics)
            self.memory.record("generate")
            return rollout_output(prompts, result)
        self.step_metrics.update(self._refresh_rollout_model())
        model = self.rollout_model
        eos, pad = model_token_ids(getattr(model, "generation_config", None), model.config)
        params = sampling_params(self.config["rollout"], prompts.meta_info, eos, pad)
        inputs = {k: prompts.batch[k].to(self.actor.device) for k in PROMPT_KEYS}
        with seeded_sampling(seed, self.rank, self.actor.device):
            result = generate_responses(model, inputs, params, synced=False)
        self.memory.record("generate")
        return rollout_output(prompts, result)

    @register(Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> dict[str, float]:
        self._engine("actor", "sync_rollout_weights")
        if self.hybrid_rollout is not None:
            return self.hybrid_rollout.sync_now(self.weights_version)
        metrics = self._refresh_rollout_model()
        self.step_metrics.update(metrics)
        return metrics

    # ---- log-probs ------------------------------------------------------------------------------------
    def _log_probs(
        self, engine: MegatronEngine, data: DataProto, micro_size: int, with_entropy: bool, method: str
    ) -> dict[str, torch.Tensor] | None:
        """Per-token log-probs (and entropies) of the responses on the last stage; None on other stages."""
        require_batch_keys(data, LOG_PROB_KEYS, method)
        temperature = float(data.meta_info.get("temperature", self.config["rollout"]["temperature"]))
        batching = MicroBatching(int(data.meta_info.get("micro_batch_size", micro_size)))
        forward = ResponseForward("log_probs", temperature, with_entropy)
        return forward_rows(engine, data, batching, forward, response_log_probs)

    @register(dispatch_mode=OVER_DP)
    def compute_log_prob(self, data: DataProto) -> DataProto | None:
        """Actor log-probs of the responses: `old_log_probs` [B, R] and `entropys` [B, R]."""
        micro = self.config["rollout"]["log_prob_micro_batch_size_per_gpu"]
        out = self._log_probs(self._engine("actor", "compute_log_prob"), data, micro, True, "compute_log_prob")
        self.memory.record("old_log_prob")
        return (
            None
            if out is None
            else DataProto.from_dict({"old_log_probs": out["log_probs"], "entropys": out["entropy"]})
        )

    @register(dispatch_mode=OVER_DP)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto | None:
        """Reference-policy log-probs of the responses: `ref_log_prob` [B, R]."""
        micro = self.config["ref"]["log_prob_micro_batch_size_per_gpu"]
        out = self._log_probs(self._engine("ref", "compute_ref_log_prob"), data, micro, False, "compute_ref_log_prob")
        return None if out is None else DataProto.from_dict({"ref_log_prob": out["log_probs"]})

    # ---- training -------------------------------------------------------------------------------------
    def _update_schedule(self) -> PPOSchedule:
        """Epochs x mini-batches x micro-batches of an update, over the data-parallel ranks."""
        where = "actor (over data-parallel ranks)"
        n = self.config["rollout"]["n"]
        seed = self.config["seed"]
        return PPOSchedule.from_config(self.config["actor"], n, self.dp_size, where, seed, self.update_calls)

    @register(dispatch_mode=METRICS_OVER_DP)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO update of this DP rank's share (epochs x mini-batches x micro-batches through the pipeline);
        metrics are averaged over micro-batches on the last stage (the driver averages the DP ranks)."""
        engine = self._engine("actor", "update_actor")
        actor_cfg = self.config["actor"]
        require_batch_keys(data, required_update_keys(actor_cfg), "update_actor")
        temperature = float(data.meta_info.get("temperature", self.config["rollout"]["temperature"]))

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return actor_loss(outputs, micro, actor_cfg)

        schedule = self._update_schedule()
        metrics = run_ppo_updates(
            engine, data, actor_forward(actor_cfg, temperature), loss_fn, schedule, "update_actor"
        )
        self.update_calls += 1
        self.weights_version += 1
        self.memory.record("update_actor")
        return metrics

    @register(dispatch_mode=METRICS_OVER_DP)
    def update_actor_sft(self, data: DataProto) -> dict[str, float]:
        """Supervised step (token NLL under `response_mask` x optional `loss_mask`) with the PPO update's
        schedule through the pipeline; same contract and metrics as the FSDP worker's `update_actor_sft`."""
        engine = self._engine("actor", "update_actor_sft")
        require_batch_keys(data, SFT_KEYS, "update_actor_sft")
        actor_cfg = self.config["actor"]
        temperature = float(data.meta_info.get("temperature", 1.0))

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return sft_loss_from_log_probs(outputs.log_probs, micro, outputs.device, actor_cfg["loss_agg_mode"])

        forward = ResponseForward("log_probs", temperature)
        schedule = self._update_schedule()
        metrics = run_ppo_updates(engine, with_loss_mask(data), forward, loss_fn, schedule, "update_actor_sft")
        self.update_calls += 1
        self.weights_version += 1
        self.memory.record("update_actor")
        return metrics

    @register(dispatch_mode=METRICS_OVER_DP)
    def update_actor_dpo(self, pairs: DataProto) -> dict[str, float]:
        """DPO update on preference pairs packed one per row (layout in `workers/training/dpo_update.py`);
        settings in `meta_info["dpo"]`. Metrics are weighted means over the real pairs of all DP ranks."""
        engine = self._engine("actor", "update_actor_dpo")
        require_batch_keys(pairs, PAIR_KEYS, "update_actor_dpo")
        metrics = run_dpo_update(
            engine,
            pairs,
            DPOSettings.from_meta(pairs.meta_info.get("dpo")),
            micro_batch_size=int(
                pairs.meta_info.get("micro_batch_size", self.config["actor"]["ppo_micro_batch_size_per_gpu"])
            ),
            grad_clip=self.config["actor"]["grad_clip"],
            temperature=float(pairs.meta_info.get("temperature", self.config["rollout"]["temperature"])),
        )
        self.weights_version += 1
        return metrics

    # ---- checkpoints ----------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        self._engine("actor", "save_checkpoint").save_checkpoint(path, {"update_calls": self.update_calls})

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        extra = self._engine("actor", "load_checkpoint").load_checkpoint(path)
        self.update_calls = int(extra["update_calls"])
        self.weights_version += 1

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """Write the actor (the ref for role "ref") as an HF checkpoint from rank 0; all ranks take part."""
        (self.actor or self._engine("ref", "export_hf")).export_hf(path)
