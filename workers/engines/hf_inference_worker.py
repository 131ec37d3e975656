"""`HFInferenceWorker`: an inference engine on plain Hugging Face `generate` (`InferenceEngine(executor="hf")`).

Same methods as the vLLM rollout worker, so the engine API and the broadcast weight sync drive either.
"""

from __future__ import annotations

from typing import Any

import torch

from single_controller import Dispatch, Worker, register
from workers.fsdp.model_loading import compute_dtype, worker_device
from workers.rollout.buckets import BucketLayout
from workers.rollout.hf_generate import engine_generate
from workers.rollout.sync_group import SyncGroupAddress, WeightSyncGroup
from workers.rollout.verify import probe_sequences, trainer_log_probs
from workers.rollout.weight_sync import IpcReceiver, receive_broadcast_buckets
from workers.vision.models import auto_model_class


class HFInferenceWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.model_path = config["model"]["path"]
        self.model: Any = None

    def _load(self) -> None:
        self.device = worker_device()
        self.dtype = compute_dtype("auto", self.device)
        # A vision-language folder loads as image-text-to-text (Qwen2-VL is no causal LM in transformers).
        self.model = (
            auto_model_class(self.model_path).from_pretrained(self.model_path, dtype=self.dtype).to(self.device).eval()
        )

    def _require_model(self, what: str) -> Any:
        if self.model is None:
            raise RuntimeError(f"{what}: the engine was released with .meta(); call .cuda() first")
        return self.model

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self._load()

    @register(Dispatch.ONE_TO_ALL)
    def generate_tokens(
        self, prompts: list[list[int]], sampling: dict[str, Any] | None = None
    ) -> list[dict[str, list]]:
        """Per prompt: generated `token_ids` and their `log_probs`, all prompts in one batch. `sampling` holds
        vLLM's field names: temperature (0 = greedy), top_k, top_p, max_tokens, stop_token_ids, seed."""
        return engine_generate(self._require_model("generate"), prompts, sampling or {}, self.device, self.rank)

    # ---- residency ------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def release(self) -> None:
        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @register(Dispatch.ONE_TO_ALL)
    def restore(self, what: str = "all") -> None:
        if self.model is None:
            self._load()  # from the folder; a weight sync brings trained weights

    # ---- weight sync (receiver side) ------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_sync(self, address: SyncGroupAddress) -> None:
        self._sync_group = WeightSyncGroup()
        self._sync_group.connect(address, 1 + self.rank)

    def _copy_in(self, pairs: Any, what: str) -> int:
        params = dict(self._require_model(what).named_parameters())
        count = 0
        with torch.no_grad():
            for name, tensor in pairs:
                params[name].copy_(tensor)
                count += 1
        return count

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, layouts: list[BucketLayout], version: int | None = None) -> None:
        """`version` (the sender's weights version) is not needed here; the broadcast sync passes it to every engine."""
        self._copy_in(receive_broadcast_buckets(layouts, self._sync_group, self.device), "receive_weights")

    @register(Dispatch.ALL_TO_ALL)
    def open_ipc_buffers(self, handles: list[Any]) -> None:
        self._ipc = IpcReceiver(handles, self.device)

    @register(Dispatch.ONE_TO_ALL)
    def load_ipc_bucket(self, index: int, layout: BucketLayout) -> int:
        loaded = self._copy_in(self._ipc.bucket(index, layout), "load_ipc_bucket")
        torch.cuda.current_stream().synchronize()  # done reading: the trainer may refill the buffer
        return loaded

    @register(Dispatch.ONE_TO_ALL)
    def finish_weight_load(self, version: int | None = None) -> None:
        """Nothing cached from the old weights (HF generate keeps no prefix cache across calls); `version`
        (the trainer's weights version) is not tracked here."""

    @register(Dispatch.ONE_TO_ALL)
    def probe_log_probs(self, vocab_size: int) -> torch.Tensor:
        return trainer_log_probs(self._require_model("probe_log_probs"), probe_sequences(vocab_size), self.device)

    @register(Dispatch.ONE_TO_ALL)
    def weights_fingerprint(self) -> float:
        model = self._require_model("weights_fingerprint")
        return float(sum(p.detach().double().abs().sum().item() for p in model.parameters()))
