"""`VLLMEngine`: a vLLM `LLM` used as the rollout engine, with the same batch contract as HF generate.

With tensor_model_parallel_size 1 the engine runs inside the calling process (vLLM's "uni" executor and
no engine-core subprocess), so the trainer can hand it tensors directly; so does each shard of a hybrid group's
engine held one per trainer process (vLLM's external launcher, workers/rollout/engine_shards.py). Otherwise with
TP > 1 vLLM starts its own worker processes and weights reach them as bytes or by broadcast. Weight loading, the
broadcast group and the fingerprint are methods of `WeightSyncExtension`, installed in every vLLM worker.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import Iterable
from typing import Any

import torch

from workers.lora.moe_vllm import adapts_fused_experts
from workers.lora.spec import LoraSpec
from workers.lora.vllm_adapter import adapter_request, engine_options
from workers.rollout.buckets import BucketLayout
from workers.rollout.engine_kwargs import vllm_engine_kwargs
from workers.rollout.engine_processes import devices_visible, transfer_chunks
from workers.rollout.engine_shards import executor_backend, launcher_ranks, summed_over_shards
from workers.rollout.shaping import sampled_rollout
from workers.rollout.sync_group import SyncGroupAddress
from workers.rollout.vllm_base_views import keep_plain_cpu_weights
from workers.rollout.vllm_options import (
    cpu_thread_binding,
    device_options,
    eager_mode,
    routing_options,
    scheduler_options,
)
from workers.rollout.vllm_requests import row_seed, sampled_tokens, vllm_sampling
from workers.routing_replay.rollout_tables import engine_table
from workers.routing_replay.token_order import ROUTED_EXPERTS
from workers.vision.models import collapse_image_placeholders

EXTENSION = "workers.rollout.vllm_extension.WeightSyncExtension"
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class VLLMEngine:
    def __init__(
        self, model_path: str, rollout: dict[str, Any], dtype: torch.dtype, device: torch.device, seed: int,
        lora: LoraSpec | None = None, shares_weights: bool = False, config_overrides: dict[str, Any] | None = None,
        visible_devices: str | None = None, shard_per_process: bool = False,
    ) -> None:
        """With `lora` the engine serves the trainer's LoRA adapter over the model folder's weights: each sync
        replaces the adapter (`load_adapter` / `receive_adapter`) and every generate uses it.
        `config_overrides`: config.json fields the trainer's model was built with (model.override_config).
        `visible_devices`: the GPUs (CUDA_VISIBLE_DEVICES form) a tensor-parallel engine of a hybrid group spans,
        its first the caller's: the trainer ranks sharing it hold one each (workers/rollout/engine_group.py).
        `shares_weights`: the trainer's frozen base will point into this engine's weight tensors
        (workers/fsdp/shared_base.py): they must stay where they are, so sleep frees only the KV cache, and
        on CPU the linears keep their [out, in] weights (`keep_plain_cpu_weights`).
        `shard_per_process`: this process holds one tensor-parallel shard of an engine spread over the trainer
        ranks of its hybrid group, every shard called with the same requests (workers/rollout/engine_shards.py)."""
        tp = rollout["tensor_model_parallel_size"]
        # In this process (tensor parallel 1 with engine_process false, or one shard per process) the trainer can
        # pass tensors to the engine without serialization; in its own, the engine steps without holding this
        # process's GIL.
        own_process = not shard_per_process and (tp > 1 or bool(rollout.get("engine_process")))
        self.shard_per_process = shard_per_process
        self.in_process = not own_process
        # Weights cross to an engine in processes of its own in chunks of a sync bucket (`load_weights`).
        self.transfer_bytes = int(rollout["weight_sync_bucket_mb"]) << 20 if own_process else 0
        self.visible_devices = visible_devices
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if own_process else "0"
        # vLLM logs every engine start at INFO (its full config); keep worker logs readable unless asked.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        if device.type == "cuda":
            # The CUDA build's FlashInfer sampler needs a JIT toolchain the workers may not have.
            os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        elif tp > 1 and own_process:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_thread_binding(tp))
        from transformers import AutoConfig

        self.device = device
        self.dtype = dtype
        self.sleep_enabled = bool(rollout["enable_sleep"]) and device.type == "cuda"
        self.free_cache_engine = bool(rollout["free_cache_engine"])
        self.asleep = False
        self.lora = lora
        self.lora_request = None  # set by the first adapter sync; until then the adapter is the identity (B = 0)
        # A LoRA engine keeps its base weights while asleep (level 1: backed up in host memory): only the
        # adapter is ever sent. Level 2 discards the weights; the next sync re-sends all of them. An engine
        # sharing its weights with the trainer sleeps its KV cache only (weights and adapter stay).
        self.sleep_level = 2 if lora is None else 1
        self.shares_weights = shares_weights
        if shares_weights and device.type != "cuda":
            keep_plain_cpu_weights()
        kwargs: dict[str, Any] = dict(
            model=model_path,
            dtype=_DTYPE_NAMES[dtype],
            seed=seed,
            tensor_parallel_size=tp,
            distributed_executor_backend=executor_backend(tp, shard_per_process),
            enforce_eager=eager_mode(rollout, device),
            max_model_len=rollout["max_model_len"],
            worker_extension_cls=EXTENSION,
            # Log-probs after temperature/top-k/top-p: the distribution the tokens were sampled from,
            # which is what the trainer's log-probs at the same temperature measure.
            logprobs_mode="processed_logprobs",
            # The checkpoint's generation_config.json must not change sampling defaults.
            generation_config="vllm",
        )
        if shard_per_process:
            # vLLM's custom all-reduce maps its peers' buffers through CUDA IPC, which needs their GPUs visible to this
            # process; Ray shows each trainer process its one GPU. NCCL's all-reduce (inside CUDA graphs as well) works.
            kwargs["disable_custom_all_reduce"] = True
        if config_overrides:  # the trainer's model.override_config: the engine builds the same model
            kwargs["hf_overrides"] = dict(config_overrides)
        if lora is not None:
            kwargs.update(engine_options(lora, adapts_fused_experts(lora, model_path)))
        kwargs.update(scheduler_options(rollout, device))
        kwargs.update(vllm_engine_kwargs(rollout.get("engine_kwargs")))
        kwargs.update(device_options(rollout, device, self.sleep_enabled))
        kwargs.update(routing_options(rollout, device))
        self.returns_routing = bool(kwargs.get("enable_return_routed_experts"))
        cpu_notes = {"enable_sleep": "vLLM's CPU backend has no sleep mode",
                     "enable_chunked_prefill": "prompts are prefilled whole there"}
        for key, why in cpu_notes.items():
            if device.type != "cuda" and rollout.get(key):
                print(f"note: rollout.{key} has no effect on CPU ({why})", file=sys.stderr)
        self._llm_kwargs = kwargs
        self.llm = self._start()
        # A vision-language model's image placeholder (None for a text model): see `generate`.
        self.image_token_id = getattr(AutoConfig.from_pretrained(model_path), "image_token_id", None)

    def _start(self) -> Any:
        from vllm import LLM

        launch = launcher_ranks(self.device) if self.shard_per_process else contextlib.nullcontext()
        with devices_visible(self.visible_devices), launch:
            return LLM(**self._llm_kwargs)

    # ---- generation -----------------------------------------------------------------------------------
    def generate(
        self, prompts: dict[str, torch.Tensor], params: Any, call_seed: int | None, rank: int,
        forced: list[int | None] | None = None, images: list[list[Any]] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Left-padded prompts -> the rollout batch of `assemble_rollout` plus `rollout_log_probs` [B, R]
        (the engine's log-probs of the sampled tokens, 0 after the response). `forced[i]`, when set, is row
        i's exact response length. `images[i]`: row i's PIL images (vLLM's `multi_modal_data`); the prompt
        holds their placeholders expanded, and vLLM gets one placeholder per image, which it expands itself."""
        return self.generate_many([(prompts, rank, images)], params, call_seed, forced)[0]

    def generate_many(
        self, batches: list[tuple[dict[str, torch.Tensor], int, list[list[Any]] | None]], params: Any,
        call_seed: int | None, forced: list[int | None] | None = None,
    ) -> list[dict[str, torch.Tensor]]:
        """`generate` of several ranks' batches `(prompts, rank, images)` in one engine call (a hybrid group's
        engine serves the prompts of every trainer rank sharing it); each row keeps its rank's sampling seed.
        Returns one rollout batch per input batch."""
        from vllm import TokensPrompt

        requests, sampling = [], []
        for prompts, rank, images in batches:
            ids, mask = prompts["input_ids"], prompts["attention_mask"].bool()
            rows = [TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(ids, mask)]
            for request, row_images in zip(rows, images or []):
                if row_images:
                    request["prompt_token_ids"] = collapse_image_placeholders(
                        request["prompt_token_ids"], self.image_token_id
                    )
                    request["multi_modal_data"] = {"image": row_images}
            lengths = forced or [None] * len(rows)
            sampling += [
                vllm_sampling(
                    params,
                    length or params.response_length,
                    None if call_seed is None else row_seed(call_seed, rank, i),
                    length or 0,
                )
                for i, length in enumerate(lengths)
            ]
            requests += rows
        outputs = iter(self._generate(requests, sampling))
        return [
            self._rollout_batch(prompts, list(itertools.islice(outputs, len(prompts["input_ids"]))), params)
            for prompts, _, _ in batches
        ]

    def _rollout_batch(
        self, prompts: dict[str, torch.Tensor], outputs: list[Any], params: Any
    ) -> dict[str, torch.Tensor]:
        sampled = [sampled_tokens(o) for o in outputs]
        cpu_prompts = {k: v.cpu() for k, v in prompts.items()}
        batch = sampled_rollout(cpu_prompts, [t for t, _ in sampled], [lp for _, lp in sampled], params)
        if self.returns_routing:  # the experts each token was routed to (routing replay R3)
            routed = [o.outputs[0].routed_experts for o in outputs]
            batch[ROUTED_EXPERTS] = engine_table(routed, cpu_prompts["attention_mask"], params.response_length)
        return batch

    def _generate(self, prompts: list[Any], sampling: Any) -> list[Any]:
        """vLLM's `generate` of `prompts` (`TokensPrompt`s) with the synced adapter, if any."""
        return self.llm.generate(prompts, sampling, use_tqdm=False, lora_request=self.lora_request)

    def prompt_log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        """log p(token_t | tokens_<t) for t >= 1 of each row of `sequences` [B, L] at temperature 1."""
        from vllm import SamplingParams, TokensPrompt

        rows = [row.tolist() for row in sequences]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
        outputs = self._generate([TokensPrompt(prompt_token_ids=r) for r in rows], params)
        return torch.tensor(
            [[float(step[t].logprob) for step, t in zip(o.prompt_logprobs[1:], r[1:])] for o, r in zip(outputs, rows)]
        )

    def generate_token_lists(self, prompts: list[list[int]], sampling: dict[str, Any]) -> list[dict[str, list]]:
        """Plain-list interface (the engine API): per prompt, the generated `token_ids` and their `log_probs`.
        `sampling` holds vLLM `SamplingParams` fields (temperature, max_tokens, seed, ...)."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(**{"max_tokens": 16, "logprobs": 0, "detokenize": False, **sampling})
        outputs = self._generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params)
        return [dict(zip(("token_ids", "log_probs"), sampled_tokens(output))) for output in outputs]

    # ---- weights --------------------------------------------------------------------------------------
    def load_weights(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load `(HF name, tensor)` pairs; returns how many tensors were loaded. In this process the tensors are
        handed over as they are; to an engine in processes of its own (a hybrid group's tensor-parallel engine)
        they go as host copies, a chunk per call, each worker taking its shard."""
        if self.in_process:
            (count,) = self.llm.collective_rpc("sc_load_named_weights", args=(pairs,))
        else:
            count = sum(self.llm.collective_rpc("sc_load_serialized_weights", args=(chunk,))[0]
                        for chunk in transfer_chunks(pairs, self.transfer_bytes))
        self.after_weight_update()
        return count

    def load_adapter(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int:
        """The trainer's `(name, tensor)` adapter factors become the engine's adapter; returns how many tensors
        were loaded (host copies to an engine in processes of its own, as `load_weights`)."""
        if self.in_process:
            count = self.llm.collective_rpc("sc_load_lora", args=(pairs, self._adapter_config()))[0]
        else:  # the whole adapter in one chunk: it is registered at once
            (blob,) = transfer_chunks(pairs, 1 << 62)
            count = self.llm.collective_rpc("sc_load_serialized_lora", args=(blob, self._adapter_config()))[0]
        self._adapter_updated()
        return count

    def receive_adapter(self, layouts: list[BucketLayout]) -> None:
        """Broadcast path: receive the adapter factors laid out as `layouts` and make them the adapter."""
        self.llm.collective_rpc(
            "sc_receive_lora_broadcast", args=([layout.to_wire() for layout in layouts], self._adapter_config())
        )
        self._adapter_updated()

    def _adapter_config(self) -> dict[str, Any]:
        if self.lora is None:
            raise RuntimeError("this engine was built without LoRA (model.lora_rank=0); it takes full weights")
        return self.lora.adapter_config()

    def _adapter_updated(self) -> None:
        self.lora_request = adapter_request()
        self.after_weight_update()

    def join_weight_sync_group(self, address: SyncGroupAddress, first_rank: int) -> None:
        self.llm.collective_rpc("sc_join_weight_sync_group", args=(address.to_wire(), first_rank))

    def receive_broadcast(self, layouts: list[BucketLayout]) -> None:
        self.llm.collective_rpc("sc_receive_broadcast", args=([layout.to_wire() for layout in layouts],))
        self.after_weight_update()

    def open_ipc_buffers(self, handles: list[Any]) -> None:
        self.llm.collective_rpc("sc_open_ipc_buffers", args=(handles,))

    def load_ipc_bucket(self, index: int, layout: BucketLayout) -> int:
        (loaded,) = self.llm.collective_rpc("sc_load_ipc_bucket", args=(index, layout))
        return loaded

    def after_weight_update(self) -> None:
        # Cached prefixes hold keys/values computed with the old weights, and the encoder cache a picture's
        # embeddings from the old vision tower (keyed by the picture alone). The reload already emptied the
        # worker's side of the encoder cache; the scheduler's side must forget it too, or a picture seen
        # before the sync is taken as cached and its embeddings are missing.
        self.llm.reset_prefix_cache()
        if self.image_token_id is not None:
            self.llm.llm_engine.reset_encoder_cache()

    def fingerprint(self) -> float:
        """Sum of |w| over the engine's weights and adapter (over all its shards: a collective for one shard
        per process)."""
        value = float(sum(self.llm.collective_rpc("sc_weights_fingerprint")))
        return summed_over_shards(value) if self.shard_per_process else value

    def kv_cache_sequences(self) -> float:
        """How many sequences of max_model_len tokens the engine's KV cache holds at once, as vLLM sized it at its
        start (gpu_memory_utilization less its weights and profiled activations, or rollout.kv_cache_gib). An
        engine given more sequences per call runs them in waves, each as long as a whole response."""
        config = self.llm.llm_engine.vllm_config
        tokens = (config.cache_config.num_gpu_blocks or 0) * config.cache_config.block_size
        return tokens / config.model_config.max_model_len

    def start_memory_figures(self) -> dict[str, float]:
        """What vLLM measured at its start before sizing the KV cache (workers/rollout/engine_start_memory.py), in
        GiB: its first worker's (a tensor-parallel engine's shards hold alike)."""
        return self.llm.collective_rpc("sc_start_memory_figures")[0]

    # ---- residency ------------------------------------------------------------------------------------
    @property
    def sleeps_between_calls(self) -> bool:
        """Whether `sleep` releases the weights (GPU sleep mode with free_cache_engine)."""
        return bool(self.sleep_enabled and self.free_cache_engine)

    def sleep(self) -> None:
        """Release the weights and the KV cache (GPU with enable_sleep and free_cache_engine; a no-op on
        CPU). The weights are discarded, not kept on the host: the trainer re-sends them on wake. A LoRA
        engine keeps its base weights in host memory instead; the trainer re-sends the adapter. An engine
        sharing its weights releases its KV cache only (workers/rollout/kv_sleep.py)."""
        if self.sleeps_between_calls and not self.asleep:
            if self.shares_weights:
                self.llm.reset_prefix_cache()  # the cached blocks' contents are about to go
                self.llm.collective_rpc("sc_release_kv_cache")
            else:
                self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def checkpoint_views(self) -> dict[str, torch.Tensor]:
        """In-process (tensor parallel 1, or this process's shard): checkpoint name -> a view of the engine's weight
        tensor (of this shard's part, for a shard)."""
        (views,) = self.llm.collective_rpc("sc_checkpoint_views")
        return views

    def release_all(self) -> None:
        """Free the weights and the KV cache: sleep (GPU, sleep mode) or shut the engine down (it is rebuilt
        from the model folder by `restore`, then needs a weight sync for trained weights)."""
        if self.shares_weights or self.shard_per_process:
            raise RuntimeError(
                "this engine's weights are shared with the trainer's base (rollout.share_base_weights) or are one "
                "shard of a hybrid group's engine; they cannot be released"
            )
        if self.sleep_enabled:
            if not self.asleep:
                self.llm.sleep(level=2)
                self.asleep = True
            return
        if self.llm is not None:
            from vllm.distributed.parallel_state import destroy_distributed_environment

            self._drop_llm()
            destroy_distributed_environment()

    def close(self) -> None:
        """Shut the engine down for good, before its worker is killed. vLLM unlinks its shared-memory queues
        (/dev/shm: the tensor-parallel group's broadcast queue, an engine core's input and output queues) and stops
        the processes of an engine in processes of its own only when its objects are collected, which a killed
        process never does: each run would leave them behind."""
        if self.llm is not None:
            self._drop_llm()

    def _drop_llm(self) -> None:
        """Collect the LLM (an engine core of its own shuts down with it) and this process's vLLM groups."""
        import gc

        from vllm.distributed.parallel_state import destroy_model_parallel

        self.llm = None
        gc.collect()
        destroy_model_parallel()

    def restore(self, what: str = "all") -> None:
        """Bring back "weights", "kv_cache" or "all" after `release_all` (a no-op when already there)."""
        if what not in ("all", "weights", "kv_cache"):
            raise ValueError(f"restore what={what!r}; valid: 'all', 'weights', 'kv_cache'")
        if self.llm is None:
            self.llm = self._start()
            return
        if self.asleep:
            # The trainer's freed activations and gradients sit in PyTorch's cache, invisible to vLLM's
            # allocator: return them to the device first, or waking can run out of memory.
            torch.cuda.empty_cache()
            for tag in (["weights", "kv_cache"] if what == "all" else [what]):
                self.llm.wake_up(tags=[tag])
            self.asleep = what == "weights"

    def wake_up(self) -> bool:
        """Re-allocate the weights, then the KV cache; True when the weights (with LoRA: the adapter, whose
        slots are refilled by a new registration) must be synced again. An engine sharing its weights only
        maps its KV cache again (False: the weights and the adapter never left)."""
        if not self.asleep:
            return False
        if not self.shares_weights:
            self.restore()
            return True
        torch.cuda.empty_cache()  # as in `restore`
        self.llm.collective_rpc("sc_restore_kv_cache")  # weights and adapter stayed: nothing to sync again
        self.asleep = False
        return False
