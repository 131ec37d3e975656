"""`TrainModule`: the base a user's algorithm module mixes in next to a Hugging Face model class.

    class Policy(TrainModule, Qwen2ForCausalLM):
        def on_weights_materialized(self):            # on each worker, after loading and sharding
            self.optimizer = torch.optim.AdamW(self.parameters(), lr=1e-5)
        def train_step(self, batch, scale):           # any public method becomes callable on the engine
            loss = scale * self(**batch, labels=batch["input_ids"]).loss
            loss.backward()
            return loss.item()

The driver creates it under `accelerate.init_empty_weights()` (parameters on the meta device: a few KB to
ship); each worker materializes it from `materialization_source()`, shards it with FSDP2 and calls
`on_weights_materialized()`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class TrainModule:
    # Class names of the blocks FSDP2 shards (and all-gathers) as units; empty: the model's own
    # `_no_split_modules` (its decoder layers).
    non_split_modules: tuple[str, ...] = ()

    def materialization_source(self) -> str:
        """The folder whose safetensors hold the initial weights (default: where the config came from)."""
        source = getattr(getattr(self, "config", None), "_name_or_path", "")
        if not source:
            raise ValueError(
                f"{type(self).__name__} has no materialization source: build its config with "
                "AutoConfig.from_pretrained(folder) or override materialization_source()"
            )
        return source

    def on_weights_materialized(self) -> None:
        """Runs on every worker once the weights are loaded and sharded: build optimizers, schedulers,
        processors here. `self.missing_parameters` names the parameters the source did not hold."""

    def preprocess_input_named_parameters(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        """Map a checkpoint tensor to this module's parameter name (e.g. under a LoRA wrapper)."""
        return name, tensor

    def postprocess_output_named_parameters(
        self, name: str, param: torch.Tensor, full_state_dict: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """What an exported parameter becomes for the inference engine: {} to drop it (LoRA factors), or
        {base name: merged tensor}."""
        return {name: param}
