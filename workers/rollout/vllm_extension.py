"""Methods added to every vLLM worker (`worker_extension_cls`), called through `LLM.collective_rpc`.

They run inside vLLM's worker, next to its model: `self` is vLLM's worker object (`model_runner`, `rank`,
`device`). The engine loads new weights with the runner's in-place `reload_weights`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from workers.lora.vllm_adapter import register_adapter
from workers.rollout.buckets import BucketLayout
from workers.rollout.checkpoint_names import CheckpointNames
from workers.rollout.engine_start_memory import start_memory_figures
from workers.rollout.kv_sleep import KV_CACHE_TAG, release_kv_cache
from workers.rollout.sync_group import SyncGroupAddress, WeightSyncGroup
from workers.rollout.verify import WeightFingerprint
from workers.rollout.vllm_base_views import checkpoint_views
from workers.rollout.weight_sync import IpcReceiver, receive_broadcast_buckets


class WeightSyncExtension:
    model_runner: Any
    rank: int
    device: torch.device
    wake_up: Any  # vLLM's GPU worker: wake_up(tags) maps the tagged sleep-mode allocations again
    _adapter_sum: float = 0.0  # the registered LoRA adapter's fingerprint, taken as it was registered (0: none)

    def _reload(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the trainer's `(name, tensor)` pairs; returns how many it sent (before the folder's naming)."""
        count = 0

        def counted() -> Iterable[tuple[str, torch.Tensor]]:
            nonlocal count
            for pair in pairs:
                count += 1
                yield pair

        self.model_runner.reload_weights(weights_iterator=self._checkpoint_names()(counted()))
        self._refresh_tied_head()
        self._repack_cpu_experts()
        return count

    def _checkpoint_names(self) -> CheckpointNames:
        # Built at the first sync, kept for the next ones (a mixture of experts builds a meta-device model).
        if getattr(self, "_names", None) is None:
            self._names = CheckpointNames(self.model_runner.model_config.hf_config)
        return self._names

    def _refresh_tied_head(self) -> None:
        # With tied embeddings the LM head shares the embedding's tensor but may keep a derived copy (the
        # CPU backend prepacks it for its GEMM); the reload does not touch the head, so rebuild that copy.
        # A vision-language model keeps the head in its language model.
        from vllm.model_executor.models.interfaces import supports_multimodal

        model = self.model_runner.get_model()
        if supports_multimodal(model):
            model = model.get_language_model()
        head = getattr(model, "lm_head", None)
        config = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        method = getattr(head, "quant_method", None)
        if config and method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)

    def _repack_cpu_experts(self) -> None:
        # vLLM's CPU backend repacks a mixture of experts' weights into its grouped-GEMM layout once, at load; a
        # reload writes the new weights in the checkpoint's layout and skips that step (a weight update), so the
        # kernel would read them as packed. Pack them again (no-op off the CPU backend).
        try:
            from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
        except ImportError:  # a build without the CPU experts
            return
        for module in self.model_runner.get_model().modules():
            kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if isinstance(experts, CPUUnquantizedExperts):
                experts.process_weights_after_loading(module)

    # ---- in-process -----------------------------------------------------------------------------------
    def sc_load_named_weights(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load `(name, tensor)` pairs (HF names); only usable when the caller shares our process."""
        return self._reload(pairs)

    def sc_load_serialized_weights(self, blob: bytes) -> int:
        """Load a chunk of weights sent as safetensors bytes by an engine's owner in another process (a hybrid
        group's tensor-parallel engine: vLLM's RPC carries bytes, not tensors); each worker takes its shard."""
        from safetensors.torch import load

        return self._reload(load(blob).items())

    # ---- LoRA adapter (model.lora_rank > 0: the base stays as loaded, only the adapter is sent) ----------
    def _register(self, pairs: Iterable[tuple[str, torch.Tensor]], adapter_config: dict[str, Any]) -> int:
        """Make the pairs the engine's adapter; returns how many tensors it took."""
        self._adapter_sum = 0.0  # the previous adapter goes first, even when this one is refused
        registered = register_adapter(self.model_runner, pairs, adapter_config)
        self._adapter_sum = registered.fingerprint
        return registered.tensors

    def sc_load_lora(self, pairs: Iterable[tuple[str, torch.Tensor]], adapter_config: dict[str, Any]) -> int:
        """In-process: make `(trainer name, tensor)` pairs of the adapter factors the engine's adapter."""
        return self._register(pairs, adapter_config)

    def sc_load_serialized_lora(self, blob: bytes, adapter_config: dict[str, Any]) -> int:
        """`sc_load_lora` from safetensors bytes (an engine in processes of its own)."""
        from safetensors.torch import load

        return self._register(load(blob).items(), adapter_config)

    def sc_receive_lora_broadcast(self, layouts: list[Any], adapter_config: dict[str, Any]) -> int:
        """`layouts` in their wire form (`BucketLayout.to_wire`): with tensor parallel > 1 this runs in vLLM's
        worker processes, and so do the broadcast methods below."""
        buckets = [BucketLayout.from_wire(layout) for layout in layouts]
        return self._register(receive_broadcast_buckets(buckets, self._sync_group, self.device), adapter_config)

    # ---- base weights shared with the trainer (LoRA, in-process: workers/fsdp/shared_base.py) -----------
    def sc_checkpoint_views(self) -> dict[str, torch.Tensor]:
        """In-process: the model's weight tensors as views under the checkpoint's names."""
        return checkpoint_views(self.model_runner.get_model())

    def sc_release_kv_cache(self) -> int:
        """GPU sleep mode: free the KV cache only (the weights, which the trainer may point into, stay)."""
        return release_kv_cache()

    def sc_restore_kv_cache(self) -> None:
        """Map the KV cache again after `sc_release_kv_cache` (vLLM's worker wake-up of that tag alone)."""
        self.wake_up(tags=[KV_CACHE_TAG])

    # ---- broadcast ------------------------------------------------------------------------------------
    def sc_join_weight_sync_group(self, address: list[Any], first_rank: int) -> None:
        """Join as rank `first_rank + self.rank` (engine workers take consecutive ranks); `address` in its wire
        form (`SyncGroupAddress.to_wire`)."""
        self._sync_group = WeightSyncGroup()
        self._sync_group.connect(SyncGroupAddress.from_wire(address), first_rank + self.rank)

    def sc_receive_broadcast(self, layouts: list[Any]) -> int:
        buckets = [BucketLayout.from_wire(layout) for layout in layouts]
        return self._reload(receive_broadcast_buckets(buckets, self._sync_group, self.device))

    # ---- CUDA IPC -------------------------------------------------------------------------------------
    def sc_open_ipc_buffers(self, handles: list[Any]) -> None:
        """Map the trainer's staging buffers (once; each sync then only names a buffer and a layout)."""
        self._ipc = IpcReceiver(handles, self.device)

    def sc_load_ipc_bucket(self, index: int, layout: BucketLayout) -> int:
        loaded = self._reload(self._ipc.bucket(index, layout))
        torch.cuda.current_stream().synchronize()  # done reading: the trainer may refill the buffer
        return loaded

    # ---- checks ---------------------------------------------------------------------------------------
    def sc_start_memory_figures(self) -> dict[str, float]:
        return start_memory_figures(self)

    def sc_weights_fingerprint(self) -> float:
        """Sum of |w| over the engine's parameters and its LoRA adapter: changes when any weight changes (for
        sync checks)."""
        base = WeightFingerprint()
        base.add(self.model_runner.get_model().parameters())
        return base.value + self._adapter_sum
