"""`ActorRolloutRefWorker`: the policy (trained with PPO or DPO), its HF-generate rollout and the frozen reference.

Roles:
    "actor_rollout"      the trainable policy; generates and computes its own log-probs
    "actor_rollout_ref"  the same, plus a separate frozen copy of the initial policy for ref log-probs
    "ref"                only the frozen reference policy

With LoRA (`model.lora_rank` > 0) the actor trains adapters over a frozen base, and the reference is that
base: the actor's forward with the adapters disabled, in either actor role (no second model is loaded).

With `actor.ulysses_sequence_parallel_size` k > 1 (Ulysses, workers/fsdp/ulysses.py) the log-prob and update
methods split the batch over W/k data-parallel groups of k ranks, which share each packed sequence;
generation still splits prompts over all W ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from workers.actor_state import ActorStateMixin
from workers.cached_blocks import set_release_point
from workers.config import actor_rollout_ref_config, mini_batch_per_rank
from workers.fsdp.engine import FSDPEngine
from workers.fsdp.offload import GIB, Offloader
from workers.fsdp.residency import ActorResidency, process_tenants
from workers.fsdp.shared_base import SharedBase, resolve_base_sharing
from workers.fsdp.ulysses import (
    METRICS_OVER_DATA_PARALLEL,
    OVER_DATA_PARALLEL,
    SequenceLayout,
    init_sequence_layout,
)
from workers.fsdp.weight_sender import WeightSenderMixin
from workers.lora.model import adapters_disabled
from workers.memory import MemoryLog
from workers.rl_math.rollout_correction import OLD_LOG_PROBS
from workers.rollout.agent.worker_glue import (
    build_agent,
    hf_agent_generate,
    vllm_agent_generate,
)
from workers.rollout.hf_generate import generate_responses, seeded_sampling
from workers.rollout.sampling import SamplingParams, model_token_ids, sampling_params
from workers.rollout.shaping import rollout_output
from workers.training.actor_loss import actor_forward, actor_loss, required_update_keys
from workers.training.backend import ResponseForward, ResponseOutputs
from workers.training.batch_keys import require_batch_keys
from workers.training.dist_utils import check_same_length
from workers.training.dpo_update import PAIR_KEYS, DPOSettings, run_dpo_update
from workers.training.forward_pass import forward_rows, response_log_probs
from workers.training.micro_batching import MicroBatching
from workers.training.ppo_loop import (
    PPOSchedule,
    check_one_optimizer_step,
    run_ppo_updates,
)
from workers.training.sft_update import (
    SFT_KEYS,
    sft_loss_from_log_probs,
    with_loss_mask,
)
from workers.vision.forward_inputs import generate_inputs
from workers.vision.images import (
    MULTI_MODAL_DATA,
    ImageInputs,
    decode_image,
    row_images,
)
from workers.vision.models import auto_model_class, is_vision_language, vision_token_ids

ROLES = ("actor_rollout", "actor_rollout_ref", "ref")
PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
LOG_PROB_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


class ActorRolloutRefWorker(ActorStateMixin, WeightSenderMixin, Worker):
    def __init__(self, config: dict[str, Any], role: str) -> None:
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; valid roles: {list(ROLES)}")
        self.role = role
        self.config = actor_rollout_ref_config(config)
        self.actor: FSDPEngine | None = None
        self.ref: FSDPEngine | None = None
        self.update_calls = 0  # part of the checkpoint: seeds the mini-batch shuffles
        self.hybrid_rollout = None  # a vLLM engine in this process (rollout.name=vllm, placement=hybrid)
        self.shared_base: SharedBase | None = None  # LoRA: the actor's frozen base, as views of that engine's weights
        self.residency: ActorResidency | None = None  # where the actor's and the reference's state is, phase by phase
        self.agent = None  # the multi-turn tool-calling rollout (rollout.multi_turn.enable)
        self.layout: SequenceLayout | None = None  # the (dp, sp) layout of the log-prob and update methods
        self.images: ImageInputs | None = None  # a vision-language model's image processor (workers/vision)
        self.init_actor_state()

    # ---- setup ----------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.init_process_group()
        set_release_point(self.config["release_cached_blocks"])
        cfg = self.config
        # The reference's size equals the actor's (workers/config.py): one layout for the whole worker.
        setting = "actor.ulysses_sequence_parallel_size"
        self.layout = init_sequence_layout(self, cfg["actor"]["ulysses_sequence_parallel_size"], setting)
        sequence_parallel = {"sequence_parallel": self.layout.group, "sequence_parallel_setting": setting}
        auto_class = auto_model_class(cfg["model"]["path"])  # a causal LM, or a vision-language model
        if self.role != "ref":
            mini_batch_per_rank(cfg["actor"], cfg["rollout"]["n"], self.layout.dp_size, self.layout.where("actor"))
            self.actor = FSDPEngine(
                auto_class,
                cfg["model"],
                self.rank,
                optim_cfg=cfg["actor"]["optim"],
                seed=cfg["seed"],
                **sequence_parallel,
            )
        if self.role == "ref" or (self.role == "actor_rollout_ref" and self.actor.lora is None):
            # With LoRA the reference is the actor's own base model (adapters disabled): no second copy.
            self.ref = FSDPEngine(auto_class, cfg["model"], self.rank, **sequence_parallel)
        if is_vision_language((self.actor or self.ref).module.config):
            self.images = ImageInputs(cfg["model"]["path"])
        rollout = cfg["rollout"]
        hybrid_vllm = self.actor is not None and rollout["name"] == "vllm" and rollout["placement"] == "hybrid"
        # A LoRA actor's frozen base becomes views of its engine's weights (rollout.share_base_weights).
        self.shared_base = self._shared_base() if hybrid_vllm else None
        self.residency = self._build_residency()
        # Offloaded models leave the GPU before the engine starts: it then finds its whole budget free, and
        # the start's peak is the engine's, not the engine's plus every model's (the memory plan's init row).
        # A base about to be shared stays: its values are compared with the engine's before it is freed.
        self.residency.before_engine_start()
        if hybrid_vllm:
            from workers.rollout.hybrid import FSDPWeightSource, HybridRollout

            if rollout["verify_sync"]:
                self.residency.actor_needed()  # the engine's first check reads the actor's initial weights
            from workers.rollout.engine_group import engine_group

            self.hybrid_rollout = HybridRollout(
                FSDPWeightSource(self.actor),
                rollout,
                seed=cfg["seed"] + self.rank,
                shares_weights=self.shared_base is not None,
                group=engine_group(rollout["tensor_model_parallel_size"], self.actor.device),
            )
            if self.shared_base is not None:
                self.step_metrics.update(
                    self.shared_base.attach(self.hybrid_rollout.engine.checkpoint_views()).metrics()
                )
        if self.actor is not None:
            eos, _ = model_token_ids(
                getattr(self.actor.module, "generation_config", None), self.actor.module.config.get_text_config()
            )
            self.agent = build_agent(rollout, cfg["model"]["path"], eos)
        device = (self.actor or self.ref).device
        self.memory = MemoryLog(device)
        self._end_phase("init")
        # Each rank samples from its own stream, reproducibly.
        torch.manual_seed(cfg["seed"] + self.rank)

    def _shared_base(self) -> SharedBase | None:
        """The actor's frozen base to share with its hybrid vLLM engine, or None (not LoRA, or turned off)."""
        from workers.rollout.hybrid import FSDPWeightSource, engine_dtype

        engine = engine_dtype(self.config["rollout"], FSDPWeightSource(self.actor))
        if not resolve_base_sharing(self.config, self.actor.dtype, engine):
            return None
        return SharedBase(self.actor.module)

    def _build_residency(self) -> ActorResidency:
        """Offloaders of the actor (parameters, optimizer state) and of the frozen reference (parameters).
        A base shared with the engine never moves: with param_offload only the adapters do."""
        actor = ref = None
        if self.actor is not None:
            offload = self.config["actor"]["fsdp_config"]
            stays = self.shared_base.stays if self.shared_base is not None else None
            actor = Offloader(
                self.actor.module,
                self.actor.optimizer,
                self.actor.device,
                offload["param_offload"],
                offload["optimizer_offload"],
                params_stay=stays,
            )
        if self.ref is not None:
            ref_offload = self.config["ref"]["fsdp_config"]["param_offload"]
            ref = Offloader(self.ref.module, None, self.ref.device, ref_offload, False, frozen=True)
        return ActorResidency(actor, ref, process_tenants())

    def _resident_actor(self, method: str, with_optimizer: bool = False) -> FSDPEngine:
        """The actor engine with its parameters (and optimizer state if asked) on the device."""
        engine = self._engine("actor", method)
        self.residency.actor_needed(with_optimizer)
        return engine

    def _sync_source(self) -> FSDPEngine:
        return self._resident_actor("broadcast_weights")

    def _end_phase(self, phase: str) -> None:
        """The phase's offload traffic and memory reading. Nothing leaves the GPU here but optimizer state a
        checkpoint brought: the actor's parameters stay until another tenant claims the device."""
        metrics = self.residency.end_phase(phase)
        if metrics:
            metrics["offload/host_buffers_gib"] = self.residency.host_bytes / GIB
        self.step_metrics.update(metrics)
        self.memory.record(phase)

    def _engine(self, which: str, method: str) -> FSDPEngine:
        engine = self.actor if which == "actor" else self.ref
        if engine is None:
            if self.actor is None and self.ref is None:
                raise RuntimeError(f"{method}: call init_model() first")
            raise RuntimeError(f"{method} needs the {which} model, which role {self.role!r} does not have")
        return engine

    # ---- rollout --------------------------------------------------------------------------------------
    def _sampling_params(self, meta_info: dict[str, Any], model: torch.nn.Module) -> SamplingParams:
        eos, pad = model_token_ids(getattr(model, "generation_config", None), model.config.get_text_config())
        params = sampling_params(self.config["rollout"], meta_info, eos, pad)
        return dataclasses.replace(params, suppress_token_ids=vision_token_ids(model.config))

    def _with_images(self, data: DataProto, method: str) -> DataProto:
        """`data` with its rows' processed images (worker-local, cached for the step) when it carries any."""
        if self.images is not None:
            return self.images.attach(data)
        if MULTI_MODAL_DATA in data.non_tensor_batch:
            raise ValueError(
                f"{method}: the batch carries images ({MULTI_MODAL_DATA!r}) but {self.config['model']['path']!r} "
                "is a text-only model"
            )
        return data

    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Left-padded prompts [B, P] -> prompts, responses [B, R], input_ids / attention_mask /
        position_ids [B, P+R], response_mask [B, R]; other keys and meta_info of the input carried over."""
        if self.config["rollout"]["placement"] == "separate":
            raise RuntimeError(
                "rollout.placement='separate': generate_sequences runs on the rollout worker group, not the actor"
            )
        if self.hybrid_rollout is not None:  # the actor's weights come to the GPU only if a sync sends them
            engine = self._engine("actor", "generate_sequences")
        else:
            engine = self._resident_actor("generate_sequences")
        require_batch_keys(prompts, PROMPT_KEYS, "generate_sequences")
        params = self._sampling_params(prompts.meta_info, engine.module)
        check_same_length(len(prompts), engine.device, "generate_sequences")
        seed = prompts.meta_info.get("seed")
        if self.hybrid_rollout is not None:
            inputs = {k: prompts.batch[k] for k in PROMPT_KEYS}
            run = images = None
            if self.agent is not None:

                def run(engine: Any) -> Any:  # the multi-turn agent loop on this rank's engine
                    return vllm_agent_generate(self.agent, engine.llm, prompts, params, self.rank, engine.lora_request)

            elif MULTI_MODAL_DATA in prompts.non_tensor_batch:  # vLLM decodes and processes the images itself
                images = [[decode_image(encoded) for encoded in row] for row in row_images(prompts)]
            result, metrics = self.hybrid_rollout.generate(
                inputs,
                params,
                seed,
                self.rank,
                self.weights_version,
                before_sync=self.residency.actor_needed,
                after_sync=self.residency.rollout_needs_device,
                run=run,
                images=images,
            )
            self.step_metrics.update(metrics)
        elif self.agent is not None:
            engine.module.eval()
            result = hf_agent_generate(
                self.agent, engine.module, prompts, params, engine.device, self.rank, self.world_size > 1
            )
        else:
            engine.module.eval()
            inputs = {k: prompts.batch[k].to(engine.device) for k in PROMPT_KEYS}
            vision = generate_inputs(engine.module, self._with_images(prompts, "generate_sequences"), engine.device)
            with seeded_sampling(seed, self.rank, engine.device):
                result = generate_responses(
                    engine.module, inputs, params, synced=self.world_size > 1, model_kwargs=vision
                )
        self._end_phase("generate")
        return rollout_output(prompts, result)

    @register(Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> dict[str, float]:
        """Hybrid vLLM: load the actor's current weights into this rank's engine now (generate_sequences
        also does it when they are stale); returns sync metrics ({} when already current)."""
        if self.hybrid_rollout is None or self.hybrid_rollout.syncs_at_generate:
            return {}  # a sleeping engine takes the weights at its next generate: nothing to load here
        self._resident_actor("sync_rollout_weights")
        metrics = self.hybrid_rollout.sync_now(self.weights_version)
        self._end_phase("sync")
        return metrics

    # ---- log-probs ------------------------------------------------------------------------------------
    def _log_probs(
        self, engine: FSDPEngine, data: DataProto, section: str, with_entropy: bool, method: str
    ) -> dict[str, torch.Tensor]:
        """{"log_probs", "entropy" (with_entropy)} [B, R], micro-batched as config section `section` says."""
        require_batch_keys(data, LOG_PROB_KEYS, method)
        check_same_length(len(data), engine.device, method)
        data = self._with_images(data, method)
        temperature = float(data.meta_info.get("temperature", self.config["rollout"]["temperature"]))
        cfg = self.config[section]
        batching = MicroBatching.for_call(
            data.meta_info,
            cfg["log_prob_micro_batch_size_per_gpu"],
            cfg["log_prob_use_dynamic_bsz"],
            cfg["log_prob_max_token_len_per_gpu"],
            f"{section}.log_prob_max_token_len_per_gpu",
            self.layout.size,
        )

        forward = ResponseForward("log_probs", temperature, with_entropy)
        return forward_rows(engine, data, batching, forward, response_log_probs)

    @register(OVER_DATA_PARALLEL)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Actor log-probs of the responses: `old_log_probs` [B, R] and `entropys` [B, R]."""
        engine = self._resident_actor("compute_log_prob")
        out = self._log_probs(engine, data, "rollout", True, "compute_log_prob")
        self._end_phase("old_log_prob")
        return DataProto.from_dict({"old_log_probs": out["log_probs"], "entropys": out["entropy"]})

    @register(OVER_DATA_PARALLEL)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Reference-policy log-probs of the responses: `ref_log_prob` [B, R]. With LoRA the reference is the
        actor's base model: the same forward with every adapter disabled."""
        if self.actor is not None and self.actor.lora is not None:
            engine = self._resident_actor("compute_ref_log_prob")
            with adapters_disabled(engine.module):
                out = self._log_probs(engine, data, "ref", False, "compute_ref_log_prob")
            self._end_phase("ref_log_prob")
        else:
            engine = self._engine("ref", "compute_ref_log_prob")
            self.residency.ref_needed()  # the actor stays: the update follows
            out = self._log_probs(engine, data, "ref", False, "compute_ref_log_prob")
            self.residency.ref_done()
            self._end_phase("ref_log_prob")
        return DataProto.from_dict({"ref_log_prob": out["log_probs"]})

    # ---- training -------------------------------------------------------------------------------------
    def _update_schedule(self) -> PPOSchedule:
        """Epochs x mini-batches x micro-batches of an update, over the data-parallel groups."""
        layout = self.layout
        actor_cfg = self.config["actor"]
        seed = self.config["seed"]
        where = layout.where("actor")
        n = self.config["rollout"]["n"]
        return PPOSchedule.from_config(actor_cfg, n, layout.dp_size, where, seed, self.update_calls, layout.size)

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO update on this rank's share; returns metrics averaged over micro-batches and ranks."""
        engine = self._resident_actor("update_actor")  # the optimizer state comes for each step only
        actor_cfg = self.config["actor"]
        require_batch_keys(data, required_update_keys(actor_cfg, with_old_log_probs=False), "update_actor")
        schedule = self._update_schedule()
        if OLD_LOG_PROBS not in data.batch.keys():
            check_one_optimizer_step(schedule, len(data))  # this update's forward gives pi_old
        data = self._with_images(data, "update_actor")
        temperature = float(data.meta_info.get("temperature", self.config["rollout"]["temperature"]))
        is_cap = self.config["rollout"].get("tis_imp_ratio_cap")

        def loss_fn(outputs: ResponseOutputs, micro: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
            return actor_loss(outputs, micro, actor_cfg, is_cap)

        metrics = run_ppo_updates(
            engine, data, actor_forward(actor_cfg, temperature), loss_fn, schedule, "update_actor"
        )
        self.update_calls += 1
        self.weights_version += 1
        if self.images is not None:
            self.images.forget()  # the step is over: its images are not needed again
        self._end_phase("update_actor")
        return metrics

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_actor_sft(self, data: DataProto) -> dict[str, float]:
        """Supervised step on the responses (token NLL under `response_mask` x optional `loss_mask`; layout
        in `workers/training/sft_update.py`) with the PPO update's schedule; log-probs at temperature 1 unless
        `meta_info["temperature"]` says otherwise. Returns `sft_loss`, `grad_norm`, `lr` over micro-batches and
        ranks."""
        engine = self._resident_actor("update_actor_sft")  # the optimizer state comes for each step only
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
        self._end_phase("update_actor")
        return metrics

    @register(METRICS_OVER_DATA_PARALLEL)
    def update_actor_dpo(self, pairs: DataProto) -> dict[str, float]:
        """DPO update on preference pairs packed one per row (layout in `workers/training/dpo_update.py`); the
        loss settings come in `meta_info["dpo"]` ({beta, loss_type, label_smoothing, epochs}). Log-probs use
        the same temperature rule as `compute_ref_log_prob`, so policy and reference are comparable.
        Generation runs on this same model, so the next `generate_sequences` samples from the new weights."""
        engine = self._resident_actor("update_actor_dpo")  # the optimizer state comes for each step only
        require_batch_keys(pairs, PAIR_KEYS, "update_actor_dpo")
        temperature = float(pairs.meta_info.get("temperature", self.config["rollout"]["temperature"]))
        metrics = run_dpo_update(
            engine,
            pairs,
            DPOSettings.from_meta(pairs.meta_info.get("dpo")),
            micro_batch_size=int(
                pairs.meta_info.get("micro_batch_size", self.config["actor"]["ppo_micro_batch_size_per_gpu"])
            ),
            grad_clip=self.config["actor"]["grad_clip"],
            temperature=temperature,
        )
        self.weights_version += 1
        self._end_phase("update_actor")
        return metrics

    # ---- checkpoints ----------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Sharded actor model + optimizer, LR schedule, RNG states and update counter (the ref is frozen)."""
        engine = self._resident_actor("save_checkpoint", with_optimizer=True)
        with self.residency.optimizer_held():
            engine.save_checkpoint(path, {"update_calls": self.update_calls})
        self._end_phase("save_checkpoint")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        engine = self._resident_actor("load_checkpoint", with_optimizer=True)
        with self.residency.optimizer_held():  # the load may create the optimizer's state with a step
            extra = engine.load_checkpoint(path)
        self.update_calls = int(extra["update_calls"])
        self.weights_version += 1
        self._end_phase("load_checkpoint")

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> None:
        """Write the actor (the ref for role "ref") as an HF checkpoint; rank 0 writes, all ranks gather."""
        if self.actor is not None:
            self._resident_actor("export_hf").export_hf(path)
            self._end_phase("export_hf")
        else:
            engine = self._engine("ref", "export_hf")
            self.residency.ref_needed()
            engine.export_hf(path)
            self.residency.ref_done()
