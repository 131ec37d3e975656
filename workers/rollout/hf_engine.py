"""`HFGenerateEngine`: a Hugging Face replica run as an inference engine: the strategy's in-process engine
(`engine_type="hf"`) and the engine API's `hf` executor (workers/engines/hf_inference_worker.py). It has the methods
of `VLLMEngine` those callers use (generate, load, fingerprint, probe, sleep), so either engine plugs in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from workers.rollout.hf_generate import engine_generate
from workers.rollout.verify import trainer_log_probs
from workers.vision.models import auto_model_class


class HFGenerateEngine:
    def __init__(self, model_path: str, dtype: torch.dtype, device: torch.device, enable_sleep: bool) -> None:
        self.device = device
        # A vision-language folder loads as image-text-to-text (Qwen2-VL is no causal LM in transformers).
        self.model = auto_model_class(model_path).from_pretrained(model_path, dtype=dtype).to(device).eval()
        # Sleeping moves the replica to host memory (GPU only: on CPU there is nowhere else to put it).
        self.sleep_enabled = enable_sleep and device.type == "cuda"
        self.asleep = False

    def generate_token_lists(
        self, prompts: list[list[int]], sampling: dict[str, Any], rank: int = 0
    ) -> list[dict[str, list]]:
        """Per prompt: the generated `token_ids` (up to `max_tokens`, cut after the first stop token) and their
        `log_probs` under the sampling distribution. One left-padded batch for all prompts; `sampling["seed"]`
        draws from a stream of (seed, rank)."""
        return engine_generate(self.model, prompts, sampling, self.device, rank)

    def prompt_log_probs(self, sequences: torch.Tensor) -> torch.Tensor:
        return trainer_log_probs(self.model, sequences, self.device)

    def load_weights(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> int:
        params = dict(self.model.named_parameters())
        loaded = 0
        with torch.no_grad():
            for name, tensor in pairs:
                if name not in params:
                    raise KeyError(f"the HF engine has no parameter {name!r} (its names: the HF checkpoint's)")
                params[name].copy_(tensor)
                loaded += 1
        return loaded

    def fingerprint(self) -> float:
        return float(sum(p.detach().double().abs().sum().item() for p in self.model.parameters()))

    def sleep(self) -> None:
        if self.sleep_enabled and not self.asleep:
            self.model.to("cpu")
            torch.cuda.empty_cache()
            self.asleep = True

    def wake_up(self) -> bool:
        """Back on the device; False: the weights were kept, no sync is needed."""
        if self.asleep:
            self.model.to(self.device)
            self.asleep = False
        return False
