"""`VLLMRolloutWorker`: vLLM engines in their own worker group (rollout.placement=separate).

Each worker holds one engine spanning `tensor_model_parallel_size` devices; the group is data parallel
over engines. New weights arrive by broadcast from the actor's rank 0 (see `separate_sync.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import AutoConfig

from protocol import DataProto
from protocol.meta_merge import (
    ROLLOUT_WEIGHTS_VERSION,  # meta_info key: the weights version a batch was generated with
)
from single_controller import Dispatch, Worker, register
from workers.config import actor_rollout_ref_config
from workers.fsdp.model_loading import compute_dtype, worker_device
from workers.lora.spec import LoraSpec
from workers.memory import MemoryLog
from workers.rollout.agent.worker_glue import build_agent, vllm_agent_generate
from workers.rollout.buckets import BucketLayout
from workers.rollout.sampling import folder_token_ids, forced_lengths, sampling_params
from workers.rollout.shaping import rollout_output
from workers.rollout.stream.worker_methods import StreamWorkerMixin
from workers.rollout.sync_group import SyncGroupAddress
from workers.rollout.verify import probe_sequences
from workers.rollout.vllm_engine import VLLMEngine
from workers.training.batch_keys import require_batch_keys
from workers.vision.images import MULTI_MODAL_DATA, decode_image, row_images
from workers.vision.models import vision_token_ids

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


class VLLMRolloutWorker(StreamWorkerMixin, Worker):
    """Every method that uses the engine itself pauses the asynchronous stream (rollout.async_training=true)
    around it, so weight loads and synchronous generates find the engine idle."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = actor_rollout_ref_config(config)
        self.engine: VLLMEngine | None = None
        self.memory: MemoryLog | None = None
        self.agent = None  # the multi-turn tool-calling rollout (rollout.multi_turn.enable)
        self.weights_version = 0  # the actor's version of the weights loaded (0: the model folder)

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        rollout, model = self.config["rollout"], self.config["model"]
        device = worker_device()
        name = rollout["dtype"] if rollout["dtype"] != "auto" else model["dtype"]
        self.dtype = compute_dtype(name, device)
        self.lora = LoraSpec.from_model_config(model)  # LoRA: the engine keeps the folder's base, syncs the adapter
        self.engine = VLLMEngine(
            model["path"], rollout, self.dtype, device, seed=self.config["seed"] + self.rank, lora=self.lora,
            config_overrides=model.get("override_config"),
        )
        self.token_ids = folder_token_ids(model["path"])
        # never sampled: image placeholders
        self.suppressed = vision_token_ids(AutoConfig.from_pretrained(model["path"]))
        self.agent = build_agent(rollout, model["path"], self.token_ids[0])
        self.memory = MemoryLog(device)
        self.memory.record("rollout_init")

    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Same contract as the actor's: prompts -> rollout batch plus `rollout_log_probs`."""
        engine = self._require_engine("generate_sequences")
        require_batch_keys(prompts, PROMPT_KEYS, "generate_sequences")
        params = sampling_params(self.config["rollout"], prompts.meta_info, *self.token_ids)
        params = dataclasses.replace(params, suppress_token_ids=self.suppressed)
        inputs = {k: prompts.batch[k] for k in PROMPT_KEYS}
        images = None
        if MULTI_MODAL_DATA in prompts.non_tensor_batch:  # encoded bytes: vLLM processes the decoded images itself
            images = [[decode_image(encoded) for encoded in row] for row in row_images(prompts)]
        with self._engine_idle("generate_sequences"):
            if self.agent is not None:
                result = vllm_agent_generate(
                    self.agent, engine.llm, prompts, params, self.rank, engine.lora_request, engine.returns_routing
                )
            else:
                forced = forced_lengths(prompts.non_tensor_batch, len(prompts), params.response_length)
                result = engine.generate(
                    inputs, params, prompts.meta_info.get("seed"), self.rank, forced, images=images
                )
        self.memory.record("rollout_generate")
        output = rollout_output(prompts, result)
        output.meta_info[ROLLOUT_WEIGHTS_VERSION] = self.weights_version
        return output

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def generate_sequences_async(self, prompts: DataProto) -> DataProto:
        """`generate_sequences` returning a future at once (the driver trains meanwhile, rollout.staleness=1)."""
        return self.generate_sequences(prompts)

    # ---- weight sync (receiver side) ------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_sync(self, address: SyncGroupAddress) -> None:
        """Engine `rank` takes group ranks 1 + rank * TP ... (rank 0 is the actor's rank 0)."""
        tp = self.config["rollout"]["tensor_model_parallel_size"]
        self._require_engine("join_weight_sync").join_weight_sync_group(address, 1 + self.rank * tp)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, layouts: list[BucketLayout], version: int | None = None) -> None:
        """Load the broadcast weights (with LoRA: the adapter); `version` is the actor's weights version they
        are (stamped on every batch generated with them)."""
        with self._engine_idle("receive_weights") as engine:
            if self.lora is None:
                engine.receive_broadcast(layouts)
            else:
                engine.receive_adapter(layouts)
            self._set_version(version)

    def _set_version(self, version: int | None) -> None:
        if version is not None:
            self.weights_version = version
            if self.stream is not None:
                self.stream.set_version(version)

    @register(Dispatch.ALL_TO_ALL)
    def open_ipc_buffers(self, handles: list[Any]) -> None:
        """CUDA IPC path (engine on a train rank's GPU): map that rank's staging buffers once."""
        self._require_engine("open_ipc_buffers").open_ipc_buffers(handles)

    @register(Dispatch.ONE_TO_ALL)
    def load_ipc_bucket(self, index: int, layout: BucketLayout) -> int:
        """Called by the feeding train rank itself (through this actor's handle), once per bucket."""
        with self._engine_idle("load_ipc_bucket") as engine:
            return engine.load_ipc_bucket(index, layout)

    @register(Dispatch.ONE_TO_ALL)
    def finish_weight_load(self, version: int | None = None) -> None:
        """After the last IPC bucket; `version` as in `receive_weights`."""
        with self._engine_idle("finish_weight_load") as engine:
            engine.after_weight_update()
            self._set_version(version)

    @register(Dispatch.ONE_TO_ALL)
    def probe_log_probs(self, vocab_size: int) -> torch.Tensor:
        with self._engine_idle("probe_log_probs") as engine:
            return engine.prompt_log_probs(probe_sequences(vocab_size))

    @register(Dispatch.ONE_TO_ALL)
    def weights_fingerprint(self) -> float:
        with self._engine_idle("weights_fingerprint") as engine:
            return engine.fingerprint()

    # ---- engine API (plain lists, residency) -----------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def generate_tokens(
        self, prompts: list[list[int]], sampling: dict[str, Any] | None = None
    ) -> list[dict[str, list]]:
        with self._engine_idle("generate") as engine:
            return engine.generate_token_lists(prompts, sampling or {})

    @register(Dispatch.ONE_TO_ALL)
    def release(self) -> None:
        engine = self._require_engine("meta")
        if self.stream is not None:  # the engine goes away: so does what it was generating
            self.stream.stop()
            self.stream = None
        engine.release_all()

    def close(self) -> None:
        """The stream stopped and the engine shut down before the worker is killed (Worker.close)."""
        if self.stream is not None:
            self.stream.stop()
            self.stream = None
        if self.engine is not None:
            self.engine.close()

    @register(Dispatch.ONE_TO_ALL)
    def restore(self, what: str = "all") -> None:
        self._require_engine("cuda").restore(what)

    @register(Dispatch.ONE_TO_ALL)
    def pop_step_metrics(self) -> dict[str, float]:
        return self.memory.pop() if self.memory else {}
