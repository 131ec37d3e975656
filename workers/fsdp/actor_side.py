"""`FSDPActorSide`: the actor worker's FSDP2 models, rollout and residency (workers/actor/side.py).

The actor and the reference are `FSDPBackend`s over the same (dp, sp) layout; with LoRA the reference is the
actor's base (adapters off) and, beside a hybrid vLLM engine, that base can be views of the engine's weights
(rollout.share_base_weights). Offloaded state moves phase by phase (workers/fsdp/residency.py). Generation:
the hybrid vLLM engine, the multi-turn agent loop, or HF generate on the actor itself (images included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from transformers import AutoConfig

from protocol import DataProto
from workers.config import mini_batch_per_rank
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.offload import Offloader
from workers.fsdp.residency import ACTOR, Residency, process_tenants
from workers.fsdp.shared_base import SharedBase, resolve_base_sharing, row_parallel_base_wanted
from workers.fsdp.side import FSDPSide
from workers.fsdp.ulysses import init_sequence_layout
from workers.fsdp_shard_group import shard_group_size
from workers.lora.model import adapters_disabled
from workers.moe_config import model_has_experts
from workers.rollout.agent.worker_glue import PROMPT_KEYS, build_agent, hf_agent_generate, vllm_agent_generate
from workers.rollout.hf_generate import generate_responses, seeded_sampling
from workers.rollout.sampling import model_token_ids, sampling_params
from workers.routing_replay.passes import routing_wanted
from workers.routing_replay.rollout_tables import generation_table
from workers.routing_replay.token_order import ROUTED_EXPERTS
from workers.vision.forward_inputs import generate_inputs
from workers.vision.images import MULTI_MODAL_DATA, ImageInputs, decode_image, row_images
from workers.vision.models import auto_model_class, is_vision_language, vision_token_ids


class FSDPActorSide(FSDPSide):
    host_buffers_metric = "offload/host_buffers_gib"

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        cfg = self.config = worker.config
        # The reference's size equals the actor's (workers/config.py): one layout for the whole worker.
        setting = "actor.ulysses_sequence_parallel_size"
        self.layout = init_sequence_layout(worker, cfg["actor"]["ulysses_sequence_parallel_size"], setting)
        self.start_metrics: dict[str, float] = {}
        sequence_parallel = {"sequence_parallel": self.layout.group, "sequence_parallel_setting": setting}
        hf_config = AutoConfig.from_pretrained(cfg["model"]["path"])
        auto_class = auto_model_class(hf_config)  # a causal LM, or a vision-language model
        experts = model_has_experts(hf_config)  # a mixture of experts shares its base at tensor parallel 1 only
        self.actor: FSDPBackend | None = None
        self.ref: FSDPBackend | None = None
        if worker.role != "ref":
            mini_batch_per_rank(cfg["actor"], cfg["rollout"]["n"], self.layout.dp_size, self.layout.where("actor"))
            shard_size = cfg["actor"]["fsdp_config"]["fsdp_size"]
            shard_ranks = shard_group_size(shard_size, worker.world_size)
            self.actor = FSDPBackend(
                auto_class, cfg["model"], worker.rank, optim_cfg=cfg["actor"]["optim"], seed=cfg["seed"],
                shard_size=shard_size, row_parallel_base=row_parallel_base_wanted(cfg, shard_ranks, experts),
                **sequence_parallel,
            )
            self.start_metrics["actor/fsdp_shard_ranks"] = float(self.actor.shard_ranks)
            if cfg["actor"].get("router_aux_loss_coef") is not None:
                self.actor.track_router_loss()
            if routing_wanted(cfg):
                self.actor.track_routing()
        if worker.role == "ref" or (worker.role == "actor_rollout_ref" and self.actor.lora is None):
            # With LoRA the reference is the actor's own base model (adapters disabled): no second copy.
            self.ref = FSDPBackend(
                auto_class, cfg["model"], worker.rank, shard_size=cfg["ref"]["fsdp_config"]["fsdp_size"],
                **sequence_parallel,
            )
        vision = is_vision_language((self.actor or self.ref).module.config)
        self.images = ImageInputs(cfg["model"]["path"]) if vision else None  # the image processor (workers/vision)
        rollout = cfg["rollout"]
        hybrid_vllm = self.actor is not None and rollout["name"] == "vllm" and rollout["placement"] == "hybrid"
        # A LoRA actor's frozen base becomes views of its engine's weights (rollout.share_base_weights).
        self.shared_base: SharedBase | None = None
        if hybrid_vllm:
            from workers.rollout.hybrid import FSDPWeightSource, engine_dtype

            engine = engine_dtype(rollout, FSDPWeightSource(self.actor))
            if resolve_base_sharing(cfg, self.actor.dtype, engine, self.actor.shard_ranks, experts=experts):
                self.shared_base = SharedBase(self.actor.module)
        self.residency = self._build_residency()
        # Offloaded models leave the GPU before the engine starts: it then finds its whole budget free, and
        # the start's peak is the engine's, not the engine's plus every model's (the memory plan's init row).
        # A base about to be shared stays: its values are compared with the engine's before it is freed.
        self.residency.offload()
        self.hybrid_rollout = self._hybrid_rollout() if hybrid_vllm else None
        self.agent = None  # the multi-turn tool-calling rollout (rollout.multi_turn.enable)
        if self.actor is not None:
            module = self.actor.module
            eos, _ = model_token_ids(getattr(module, "generation_config", None), module.config.get_text_config())
            self.agent = build_agent(rollout, cfg["model"]["path"], eos)

    def _build_residency(self) -> Residency:
        """Offloaders of the actor (parameters, optimizer state) and of the frozen reference (parameters).
        A base shared with the engine never moves: with param_offload only the adapters do."""
        actor = ref = None
        if self.actor is not None:
            offload = self.config["actor"]["fsdp_config"]
            stays = self.shared_base.stays if self.shared_base is not None else None
            actor = Offloader(
                self.actor.module, self.actor.optimizer, self.actor.device, offload["param_offload"],
                offload["optimizer_offload"], params_stay=stays,
            )
        if self.ref is not None:
            ref_offload = self.config["ref"]["fsdp_config"]["param_offload"]
            ref = Offloader(self.ref.module, None, self.ref.device, ref_offload, False, frozen=True)
        return Residency(ACTOR, actor, process_tenants(), ref)

    def _hybrid_rollout(self) -> Any:
        from workers.rollout.engine_group import engine_group
        from workers.rollout.hybrid import FSDPWeightSource, HybridRollout

        rollout = self.config["rollout"]
        if rollout["verify_sync"]:
            self.residency.trained_needed()  # the engine's first check reads the actor's initial weights
        hybrid = HybridRollout(
            FSDPWeightSource(self.actor), rollout, seed=self.config["seed"], rank=self.worker.rank,
            shares_weights=self.shared_base is not None,
            group=engine_group(rollout["tensor_model_parallel_size"], self.actor.device, not rollout["engine_process"]),
        )
        self.start_metrics.update(hybrid.start_metrics)
        if self.shared_base is not None:
            self.start_metrics.update(self.shared_base.attach(hybrid.engine.checkpoint_views()).metrics())
        return hybrid

    # ---- residency (the trained actor's hooks: FSDPSide) ------------------------------------------------
    @contextmanager
    def reference(self, method: str) -> Iterator[FSDPBackend]:
        if self.actor is not None and self.actor.lora is not None:
            self.residency.trained_needed()
            with adapters_disabled(self.actor.module):
                yield self.actor
            return
        engine = self.worker._engine("ref", method)
        self.residency.ref_needed()  # the actor stays: the update follows
        yield engine
        self.residency.ref_done()

    # ---- images ---------------------------------------------------------------------------------------
    def with_images(self, data: DataProto, method: str) -> DataProto:
        if self.images is not None:
            return self.images.attach(data)
        if MULTI_MODAL_DATA in data.non_tensor_batch:
            raise ValueError(
                f"{method}: the batch carries images ({MULTI_MODAL_DATA!r}) but {self.config['model']['path']!r} "
                "is a text-only model"
            )
        return data

    def after_update(self) -> None:
        if self.images is not None:
            self.images.forget()  # the step is over: its images are not needed again

    # ---- generation -----------------------------------------------------------------------------------
    def generate(self, prompts: DataProto, weights_version: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        engine, rank, synced = self.actor, self.worker.rank, self.worker.world_size > 1
        if self.hybrid_rollout is None:
            self.residency.trained_needed()  # with an engine, the weights come to the GPU only if a sync sends them
        model = engine.module
        eos, pad = model_token_ids(getattr(model, "generation_config", None), model.config.get_text_config())
        params = sampling_params(self.config["rollout"], prompts.meta_info, eos, pad)
        params = dataclasses.replace(params, suppress_token_ids=vision_token_ids(model.config))
        seed = prompts.meta_info.get("seed")
        if self.hybrid_rollout is not None:
            inputs = {k: prompts.batch[k] for k in PROMPT_KEYS}
            run = images = None
            if self.agent is not None:

                def run(vllm: Any) -> Any:  # the multi-turn agent loop on this rank's engine
                    return vllm_agent_generate(
                        self.agent, vllm.llm, prompts, params, rank, vllm.lora_request, vllm.returns_routing
                    )

            elif MULTI_MODAL_DATA in prompts.non_tensor_batch:  # vLLM decodes and processes the images itself
                images = [[decode_image(encoded) for encoded in row] for row in row_images(prompts)]
            return self.hybrid_rollout.generate(
                inputs, params, seed, rank, weights_version, before_sync=self.residency.trained_needed,
                after_sync=self.residency.rollout_needs_device, run=run, images=images,
            )
        engine.module.eval()
        records = self.config["rollout"]["enable_rollout_routing_replay"]  # the experts of each token (R3)
        if self.agent is not None:
            routing = engine.routing.choices if records else None
            turns = hf_agent_generate(self.agent, engine.module, prompts, params, engine.device, rank, synced, routing)
            return turns, {}
        inputs = {k: prompts.batch[k].to(engine.device) for k in PROMPT_KEYS}
        vision = generate_inputs(engine.module, self.with_images(prompts, "generate_sequences"), engine.device)
        recording = engine.routing.choices.recording() if records else nullcontext()
        with seeded_sampling(seed, rank, engine.device), recording:
            result = generate_responses(engine.module, inputs, params, synced=synced, model_kwargs=vision)
        if records:  # the experts each token was routed to (routing replay R3)
            result[ROUTED_EXPERTS] = generation_table(engine.routing.choices.recorded_calls(), result["attention_mask"])
        return result, {}

    def weight_source(self) -> Any:
        from workers.rollout.hybrid import FSDPWeightSource

        return FSDPWeightSource(self.actor)

    def sync_rollout_weights(self, weights_version: int) -> dict[str, float] | None:
        """Hybrid vLLM only; a sleeping engine takes the weights at its next generate: nothing to load here."""
        if self.hybrid_rollout is None or self.hybrid_rollout.syncs_at_generate:
            return None
        self.residency.trained_needed()
        return self.hybrid_rollout.sync_now(weights_version)
