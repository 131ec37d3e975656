"""`HFInferenceWorker`: an inference engine on plain Hugging Face `generate` (`InferenceEngine(executor="hf")`).

Same methods as the vLLM rollout worker, so the engine API and the broadcast weight sync drive either; the model,
its generate, loads and checks are `HFGenerateEngine`'s (workers/rollout/hf_engine.py).
"""

from __future__ import annotations

from typing import Any

import torch

from single_controller import Dispatch, Worker, register
from workers.fsdp.model_loading import compute_dtype, worker_device
from workers.rollout.buckets import BucketLayout
from workers.rollout.hf_engine import HFGenerateEngine
from workers.rollout.sync_group import SyncGroupAddress, WeightSyncGroup
from workers.rollout.verify import probe_sequences
from workers.rollout.weight_sync import IpcReceiver, receive_broadcast_buckets


class HFInferenceWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.model_path = config["model"]["path"]
        self.engine: HFGenerateEngine | None = None

    def _require_engine(self, what: str) -> HFGenerateEngine:
        if self.engine is None:
            raise RuntimeError(f"{what}: the engine was released with .meta(); call .cuda() first")
        return self.engine

    @property
    def model(self) -> Any:
        return self._require_engine("model").model

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.device = worker_device()
        self.engine = HFGenerateEngine(self.model_path, compute_dtype("auto", self.device), self.device, False)

    @register(Dispatch.ONE_TO_ALL)
    def generate_tokens(
        self, prompts: list[list[int]], sampling: dict[str, Any] | None = None
    ) -> list[dict[str, list]]:
        """`HFGenerateEngine.generate_token_lists`; `sampling` holds vLLM's field names (temperature 0 = greedy)."""
        return self._require_engine("generate").generate_token_lists(prompts, sampling or {}, self.rank)

    # ---- residency ------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def release(self) -> None:
        self.engine = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @register(Dispatch.ONE_TO_ALL)
    def restore(self, what: str = "all") -> None:
        if self.engine is None:
            self.init_model()  # from the folder; a weight sync brings trained weights

    # ---- weight sync (receiver side) ------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_sync(self, address: SyncGroupAddress) -> None:
        self._sync_group = WeightSyncGroup()
        self._sync_group.connect(address, 1 + self.rank)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, layouts: list[BucketLayout], version: int | None = None) -> None:
        """`version` (the sender's weights version) is not needed here; the broadcast sync passes it to every engine."""
        engine = self._require_engine("receive_weights")
        engine.load_weights(receive_broadcast_buckets(layouts, self._sync_group, self.device))

    @register(Dispatch.ALL_TO_ALL)
    def open_ipc_buffers(self, handles: list[Any]) -> None:
        self._ipc = IpcReceiver(handles, self.device)

    @register(Dispatch.ONE_TO_ALL)
    def load_ipc_bucket(self, index: int, layout: BucketLayout) -> int:
        loaded = self._require_engine("load_ipc_bucket").load_weights(self._ipc.bucket(index, layout))
        torch.cuda.current_stream().synchronize()  # done reading: the trainer may refill the buffer
        return loaded

    @register(Dispatch.ONE_TO_ALL)
    def finish_weight_load(self, version: int | None = None) -> None:
        """Nothing cached from the old weights (HF generate keeps no prefix cache); `version` is not tracked."""

    @register(Dispatch.ONE_TO_ALL)
    def probe_log_probs(self, vocab_size: int) -> torch.Tensor:
        return self._require_engine("probe_log_probs").prompt_log_probs(probe_sequences(vocab_size))

    @register(Dispatch.ONE_TO_ALL)
    def weights_fingerprint(self) -> float:
        return self._require_engine("weights_fingerprint").fingerprint()
