"""LoRA through the engine API: the adapter trains, the inference engine receives merged base weights.

    python -m examples.engine_lora [--model outputs/tiny_model]

`LoraPolicy` is `TinyPolicy` with peft LoRA adapters injected on the driver (still on the meta device).
Its two hooks do the mapping: checkpoint names go to the wrapped `base_layer`s on load, and on export each
adapted weight becomes `W + scaling * B @ A` under its original name while the factors are dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from accelerate import init_empty_weights
from peft import LoraConfig, inject_adapter_in_model
from torch import nn
from transformers import AutoConfig

from examples.engine_quickstart import TinyPolicy, run_example
from workers.engines import InferenceEngine, NeedParallel, TrainEngine

ADAPTER = "default"
BASE = ".base_layer."


class LoraPolicy(TinyPolicy):
    def preprocess_input_named_parameters(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        prefix, _, leaf = name.rpartition(".")
        wrapped = f"{prefix}{BASE}{leaf}"
        return (wrapped, tensor) if wrapped in self._own_names() else (name, tensor)

    def postprocess_output_named_parameters(
        self, name: str, param: torch.Tensor, full_state_dict: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        if ".lora_A." in name or ".lora_B." in name:
            return {}  # folded into the base weight below
        if BASE not in name:
            return {name: param}
        prefix, leaf = name.split(BASE)
        if leaf != "weight":
            return {f"{prefix}.{leaf}": param}
        a = full_state_dict[f"{prefix}.lora_A.{ADAPTER}.weight"]
        b = full_state_dict[f"{prefix}.lora_B.{ADAPTER}.weight"]
        scaling = self.get_submodule(prefix).scaling[ADAPTER]
        return {f"{prefix}.weight": param + (scaling * (b.float() @ a.float())).to(param.dtype)}

    def on_weights_materialized(self) -> None:
        # The adapter factors are not in the checkpoint: LoRA's usual start (A random, B zero: no change).
        for name, param in self.named_parameters():
            if ".lora_A." in name:
                nn.init.kaiming_uniform_(param, a=math.sqrt(5))
            elif ".lora_B." in name:
                nn.init.zeros_(param)
        self.optimizer = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=2e-2)

    def _own_names(self) -> set[str]:
        if not hasattr(self, "_names"):
            self._names = {n for n, _ in self.named_parameters()}
        return self._names


def lora_policy(model_path: str, rank: int = 8) -> LoraPolicy:
    with init_empty_weights():
        policy = LoraPolicy(AutoConfig.from_pretrained(model_path))
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "down_proj"]), policy)
    return policy  # only the adapter factors require grad


def run(model_path: str, steps: int = 5) -> dict[str, object]:
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    greedy = {"temperature": 0.0, "max_tokens": 8}
    infer = InferenceEngine(model_path, executor="vllm").build()
    before = [r["token_ids"] for part in infer.generate(prompts, greedy) for r in part]
    train = TrainEngine(lora_policy(model_path)).build(colocate_with=infer)
    target = [p + [40, 41, 42, 43, 44, 45, 46, 47] for p in prompts]
    losses = []
    for _ in range(steps):
        losses.append(train.train_step(NeedParallel(target), 1.0)[0])
        train.optimizer_step()
    sync = train.p2p_weight_sync(infer)
    after = [r["token_ids"] for part in infer.generate(prompts, greedy) for r in part]
    return {"before": before, "after": after, "losses": losses, "sync": sync, "train": train, "infer": infer}


def main() -> None:
    from trainer.tiny_model import build_tiny_model

    run_example(__doc__, "outputs/tiny_model", build_tiny_model, run)


if __name__ == "__main__":
    main()
