"""`MegatronActorSide`: the actor worker's megatron-core models and rollout (workers/actor/side.py).

The actor and the reference are `MegatronBackend`s over TP x PP x DP; with `actor.megatron.*_offload` /
`ref.megatron.param_offload` their state leaves the device while another tenant computes (workers/megatron/
offload.py, under the FSDP workers' residency policy: the hybrid engine's generation, the reference's pass). Every
rank generates its share with a vLLM engine in its process (`rollout.name=vllm`) or an HF replica of the
policy, either refreshed from the Megatron weights (TP-gathered, PP-broadcast as whole HF tensors) whenever
they changed; or, with `rollout.placement=separate`, vLLM engines of their own take the same stream by
broadcast (`weight_source`, the actor worker's WeightSenderMixin). Text-only models.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from protocol import DataProto
from workers.config import mini_batch_per_rank
from workers.fsdp.residency import ACTOR, Residency, process_tenants
from workers.megatron.backend import MegatronBackend
from workers.megatron.moe import copy_into_hf_model
from workers.megatron.offload import MegatronOffloader
from workers.megatron.router_training import RouterTraining
from workers.megatron.side import MegatronSide, trained_offloader
from workers.rollout.agent.worker_glue import PROMPT_KEYS, build_agent, hf_agent_generate, vllm_agent_generate
from workers.rollout.hf_generate import generate_responses, seeded_sampling
from workers.rollout.sampling import folder_token_ids, model_token_ids, sampling_params
from workers.routing_replay.hooks import RouterChoices
from workers.routing_replay.passes import routing_wanted
from workers.routing_replay.rollout_tables import generation_table
from workers.routing_replay.token_order import ROUTED_EXPERTS
from workers.vision.images import MULTI_MODAL_DATA


class MegatronActorSide(MegatronSide):
    host_buffers_metric = "offload/host_buffers_gib"

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        cfg = self.config = worker.config
        settings = self.init_parallel(worker, cfg["actor"]["megatron"])
        self.start_metrics: dict[str, float] = {}
        max_positions = max(4096, cfg["rollout"]["max_model_len"] or 0)
        self.actor: MegatronBackend | None = None
        self.ref: MegatronBackend | None = None
        self.hybrid_rollout = None
        self.rollout_model: torch.nn.Module | None = None  # HF generate (rollout.name=hf)
        self.rollout_routing: RouterChoices | None = None  # its routers' choices (routing replay R3)
        self.rollout_version = 0  # the weights version the HF replica holds
        # The reference's routers compute as the actor's (their dtype); their losses act in training passes only.
        router = RouterTraining.from_config(
            cfg["actor"]["megatron"]["override_transformer_config"], cfg["actor"]["router_aux_loss_coef"]
        )
        if worker.role != "ref":
            mini_batch_per_rank(cfg["actor"], cfg["rollout"]["n"], self.data_parallel_size, self.where("actor"))
            self.actor = MegatronBackend(
                cfg["model"], settings, cfg["actor"]["optim"], seed=cfg["seed"], max_positions=max_positions,
                router=router,
            )
            if routing_wanted(cfg):
                self.actor.track_routing()
        if worker.role in ("actor_rollout_ref", "ref"):
            self.ref = MegatronBackend(
                cfg["model"], settings, seed=cfg["seed"], max_positions=max_positions, router=router
            )
        self.residency = self._build_residency()
        # Offloaded models leave the GPU before the rollout starts: the engine then finds its whole budget free.
        self.residency.offload()
        if self.actor is not None and cfg["rollout"]["placement"] == "hybrid":
            self._start_rollout()  # separate engines are their own worker group, fed by broadcast_weights
        # The multi-turn tool-calling rollout (rollout.multi_turn.enable), on the engine or the HF replica.
        self.agent = None
        if self.actor is not None:
            self.agent = build_agent(cfg["rollout"], cfg["model"]["path"], folder_token_ids(cfg["model"]["path"])[0])

    def _build_residency(self) -> Residency:
        actor = ref = None
        if self.actor is not None:
            actor = trained_offloader(self.actor, self.config["actor"]["megatron"])
        if self.ref is not None:
            ref = MegatronOffloader(self.ref, self.config["ref"]["megatron"]["param_offload"], frozen=True)
        return Residency(ACTOR, actor, process_tenants(), ref)

    def _start_rollout(self) -> None:
        """The hybrid vLLM engine (rollout.name=vllm) or the HF replica of the policy, in this process."""
        cfg = self.config
        if cfg["rollout"]["name"] == "vllm":
            from workers.megatron.rollout_source import MegatronWeightSource
            from workers.rollout.engine_group import engine_group
            from workers.rollout.hybrid import HybridRollout

            rollout = cfg["rollout"]
            if rollout["verify_sync"]:
                self.residency.trained_needed()  # the engine's first check reads the actor's initial weights
            tp = rollout["tensor_model_parallel_size"]
            group = engine_group(tp, self.actor.device, not rollout["engine_process"])
            self.hybrid_rollout = HybridRollout(
                MegatronWeightSource(self.actor), rollout, seed=cfg["seed"], rank=self.worker.rank, group=group
            )
            self.start_metrics.update(self.hybrid_rollout.start_metrics)
            return
        self.rollout_model = AutoModelForCausalLM.from_pretrained(cfg["model"]["path"], dtype=self.actor.dtype)
        self.rollout_model.to(self.actor.device).eval()
        if cfg["rollout"]["enable_rollout_routing_replay"]:  # the replica's routers record each token's experts
            self.rollout_routing = RouterChoices(self.rollout_model)

    # ---- residency (the trained actor's hooks: MegatronSide) ------------------------------------------------
    @contextmanager
    def reference(self, method: str) -> Iterator[MegatronBackend]:
        engine = self.worker._engine("ref", method)
        self.residency.ref_needed()  # the actor stays: the update follows
        yield engine
        self.residency.ref_done()

    def with_images(self, data: DataProto, method: str) -> DataProto:
        if MULTI_MODAL_DATA in data.non_tensor_batch:
            raise ValueError(
                f"{method}: the batch carries images ({MULTI_MODAL_DATA!r}); the Megatron backend trains text-only "
                "models (actor.strategy=fsdp trains vision-language models)"
            )
        return data

    def after_update(self) -> None:
        pass

    def weight_source(self) -> Any:
        from workers.megatron.rollout_source import MegatronWeightSource

        return MegatronWeightSource(self.actor)

    # ---- generation -----------------------------------------------------------------------------------
    def _refresh_rollout_model(self, weights_version: int) -> dict[str, float]:
        """Copy the actor's current weights into the HF replica (collective) unless it has them."""
        if self.rollout_version == weights_version:
            return {}
        self.residency.trained_needed()
        start = time.perf_counter()
        params = dict(self.rollout_model.named_parameters())
        count = 0
        with torch.no_grad():
            for name, tensor in self.actor.hf_weights():
                copy_into_hf_model(params, name, tensor)  # checkpoint names; fused experts in memory
                count += 1
        self.rollout_version = weights_version
        return {"rollout/sync_s": time.perf_counter() - start, "rollout/sync_tensors": float(count)}

    def generate(self, prompts: DataProto, weights_version: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        self.with_images(prompts, "generate_sequences")
        seed, rank = prompts.meta_info.get("seed"), self.worker.rank
        if self.hybrid_rollout is not None:
            eos, pad = folder_token_ids(self.actor.model_path)
            params = sampling_params(self.config["rollout"], prompts.meta_info, eos, pad)
            inputs = {k: prompts.batch[k] for k in PROMPT_KEYS}
            run = None
            if self.agent is not None:

                def run(vllm: Any) -> dict[str, torch.Tensor]:  # the multi-turn agent loop on this rank's engine
                    return vllm_agent_generate(
                        self.agent, vllm.llm, prompts, params, rank, vllm.lora_request, vllm.returns_routing
                    )

            return self.hybrid_rollout.generate(
                inputs, params, seed, rank, weights_version, before_sync=self.residency.trained_needed,
                after_sync=self.residency.rollout_needs_device, run=run,
            )
        metrics = self._refresh_rollout_model(weights_version)
        self.residency.rollout_needs_device()  # the replica generates: the actor's offloadable state leaves
        model = self.rollout_model
        eos, pad = model_token_ids(getattr(model, "generation_config", None), model.config)
        params = sampling_params(self.config["rollout"], prompts.meta_info, eos, pad)
        routing = self.rollout_routing
        if self.agent is not None:  # each rank's replica runs its conversations alone (synced=False)
            device = self.actor.device
            return hf_agent_generate(self.agent, model, prompts, params, device, rank, False, routing), metrics
        inputs = {k: prompts.batch[k].to(self.actor.device) for k in PROMPT_KEYS}
        with seeded_sampling(seed, rank, self.actor.device), routing.recording() if routing else nullcontext():
            result = generate_responses(model, inputs, params, synced=False)
        if routing is not None:  # the experts each token was routed to (routing replay R3)
            result[ROUTED_EXPERTS] = generation_table(routing.recorded_calls(), result["attention_mask"])
        return result, metrics

    def sync_rollout_weights(self, weights_version: int) -> dict[str, float] | None:
        if self.hybrid_rollout is not None:
            if self.hybrid_rollout.syncs_at_generate:
                return None
            self.residency.trained_needed()
            return self.hybrid_rollout.sync_now(weights_version)
        if self.rollout_model is None:  # separate engines: the driver broadcasts to them
            return None
        return self._refresh_rollout_model(weights_version)
