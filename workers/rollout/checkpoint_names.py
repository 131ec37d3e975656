"""The trainer's tensors under the names and layout of the model folder, which vLLM's weight loaders read.

transformers 5 loads some checkpoints into another layout than their files hold: a mixture of experts' per-expert
`mlp.experts.{e}.gate_proj/up_proj/down_proj.weight` become fused `mlp.experts.gate_up_proj` and
`mlp.experts.down_proj` tensors of all experts. The trainer syncs the tensors it holds, and vLLM's `load_weights`
matches the files' names: a fused tensor it does not know is not loaded, and the engine keeps its old experts.
So before an engine loads, each tensor goes through transformers' own reverse conversion (the one
`save_pretrained` applies), for the model types that have one; the others pass as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers.conversion_mapping import get_checkpoint_conversion_mapping
from transformers.core_model_loading import revert_weight_conversion


class CheckpointNames:
    """Maps `(trainer name, tensor)` pairs of a model of `hf_config` to the model folder's pairs."""

    def __init__(self, hf_config: Any) -> None:
        self.model: torch.nn.Module | None = None
        if get_checkpoint_conversion_mapping(getattr(hf_config, "model_type", None)) is not None:
            # The conversion is looked up from the model's modules; on the meta device they hold no memory.
            with torch.device("meta"):
                self.model = AutoModelForCausalLM.from_config(hf_config)

    def __call__(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        if self.model is None:
            yield from pairs
            return
        for name, tensor in pairs:
            yield from revert_weight_conversion(self.model, {name: tensor}).items()
