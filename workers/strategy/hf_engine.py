"""`HFGenerateEngine`: an in-process Hugging Face replica used as the strategy's inference engine
(`engine_type="hf"`). It has the methods of `VLLMEngine` the strategy calls, so either engine plugs in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from workers.rollout.verify import trainer_log_probs


class HFGenerateEngine:
    def __init__(self, model_path: str, dtype: torch.dtype, device: torch.device, enable_sleep: bool) -> None:
        self.device = device
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
        self.pad_token_id = self.model.config.pad_token_id or 0
        # Sleeping moves the replica to host memory (GPU only: on CPU there is nowhere else to put it).
        self.sleep_enabled = enable_sleep and device.type == "cuda"
        self.asleep = False

    def generate_token_lists(self, prompts: list[list[int]], sampling: dict[str, Any]) -> list[dict[str, list]]:
        """Per prompt: the generated `token_ids` (up to `max_tokens`, cut after the first stop token) and their
        `log_probs` under the sampling distribution. One left-padded batch for all prompts."""
        if not prompts:
            return []
        temperature = float(sampling.get("temperature", 1.0))
        max_tokens = int(sampling.get("max_tokens", 16))
        stop = set(sampling.get("stop_token_ids") or []) | set(self._eos_ids())
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        generator_kwargs: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            generator_kwargs.update(temperature=temperature, top_k=int(sampling.get("top_k", 0)) or None,
                                    top_p=float(sampling.get("top_p", 1.0)))
        else:
            generator_kwargs.update(temperature=None, top_k=None, top_p=None)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, output_scores=True,
                return_dict_in_generate=True, pad_token_id=self.pad_token_id, eos_token_id=sorted(stop) or None,
                **generator_kwargs,
            )
        new_tokens = out.sequences[:, width:]
        step_log_probs = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
        chosen = step_log_probs.gather(-1, new_tokens[..., None])[..., 0]
        results = []
        for tokens, log_probs in zip(new_tokens.tolist(), chosen.tolist()):
            length = next((i + 1 for i, t in enumerate(tokens) if t in stop), len(tokens))
            results.append({"token_ids": tokens[:length], "log_probs": log_probs[:length]})
        return results

    def _eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))

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
