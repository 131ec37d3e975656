"""LoRA through the engine API: the adapter trains, the inference engine receives merged base weights.

    python -m examples.engine_lora [--model outputs/tiny_model]

`LoraPolicy` is `TinyPolicy` with peft LoRA adapters injected on the driver (still on the meta device).
Its two hooks do the mapping: checkpoint names go to the wrapped `base_layer`s on load, and on export each
adapted weight becomes `W + scaling * B @ A` (float32, rounded once) under its original name while the
factors are dropped. The adapter's random start comes from `seed` alone: same seed, same adapter and losses.
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
from workers.engines.materialize import fill_from_full

ADAPTER = "default"
BASE = ".base_layer."
LEARNING_RATE = 5e-3
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12]]
TARGETS = [p + [40, 41, 42, 43, 44, 45, 46, 47] for p in PROMPTS]


class LoraPolicy(TinyPolicy):
    adapter_seed = 0  # lora_policy(seed=...) sets it per instance

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
        return {f"{prefix}.weight": merged_weight(param, a, b, scaling)}

    def on_weights_materialized(self) -> None:
        # The adapter factors are not in the checkpoint: LoRA's usual start (A random, B zero: no change).
        # A is drawn in full from its own generator seeded by `adapter_seed` and each rank keeps its shard:
        # the same adapter on every rank and in every run with that seed (the global RNG differs by process).
        generator = torch.Generator().manual_seed(self.adapter_seed)
        for name, param in self.named_parameters():
            if ".lora_A." in name:
                fill_from_full(param, nn.init.kaiming_uniform_(torch.empty(param.shape), a=math.sqrt(5), generator=generator))
            elif ".lora_B." in name:
                fill_from_full(param, torch.zeros(param.shape))
        # Not 2e-2: on the 0.5B shape that grew s·B·A to the base weights' size in five steps and left some
        # adapters ill-conditioned (one bf16 rounding of the weights moved a probe log-prob by 0.6), so the
        # sync check failed on correct weights (docs/benchmarks.md, the LoRA example's gap).
        self.optimizer = torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=LEARNING_RATE)

    def _own_names(self) -> set[str]:
        if not hasattr(self, "_names"):
            self._names = {n for n, _ in self.named_parameters()}
        return self._names


def merged_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """`base + scaling * b @ a` computed in float32 and rounded to the base's dtype once. (The train engine's
    parameters are float32 master weights, so the sync's cast to bf16 is that one rounding; adding a delta
    already cast to a half-precision base would round twice, the delta and then the sum.)"""
    return (base.float() + scaling * (b.float() @ a.float())).to(base.dtype)


def lora_policy(model_path: str, rank: int = 8, seed: int = 0) -> LoraPolicy:
    """The policy with its adapter injected; `seed` fixes the adapter's initial A factors."""
    with init_empty_weights():
        policy = LoraPolicy(AutoConfig.from_pretrained(model_path))
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "down_proj"]), policy)
    policy.adapter_seed = seed
    return policy  # only the adapter factors require grad


def train_steps(train: TrainEngine, steps: int) -> list[float]:
    """The example's training: `steps` supervised steps towards TARGETS; rank 0's loss of each."""
    losses = []
    for _ in range(steps):
        losses.append(train.train_step(NeedParallel(TARGETS), 1.0)[0])
        train.optimizer_step()
    return losses


def run(model_path: str, steps: int = 5, seed: int = 0) -> dict[str, object]:
    greedy = {"temperature": 0.0, "max_tokens": 8}
    infer = InferenceEngine(model_path, executor="vllm").build()
    train = None
    try:  # a failed step (e.g. a sync that does not verify) leaves no engine behind
        before = [r["token_ids"] for part in infer.generate(PROMPTS, greedy) for r in part]
        train = TrainEngine(lora_policy(model_path, seed=seed)).build(colocate_with=infer)
        losses = train_steps(train, steps)
        sync = train.p2p_weight_sync(infer)
        after = [r["token_ids"] for part in infer.generate(PROMPTS, greedy) for r in part]
    except BaseException:
        for engine in (train, infer):
            if engine is not None:
                engine.shutdown()
        raise
    return {"before": before, "after": after, "losses": losses, "sync": sync, "train": train, "infer": infer}


def main() -> None:
    from trainer.tiny_model import build_tiny_model

    run_example(__doc__, "outputs/tiny_model", build_tiny_model, run)


if __name__ == "__main__":
    main()
