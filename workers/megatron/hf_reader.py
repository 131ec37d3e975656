"""Reading one pipeline stage's tensors from an HF safetensors folder, without loading the rest."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable

import torch
from safetensors import safe_open

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


class HFCheckpointReader:
    """Index of tensor name -> safetensors file of an HF model folder; reads tensors on demand."""

    def __init__(self, folder: str) -> None:
        files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
        if not files:
            raise FileNotFoundError(
                f"no *.safetensors files in {folder!r}: the Megatron backend loads HF weights from safetensors"
            )
        self.files: dict[str, str] = {}
        for file in files:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():
                    self.files[name] = file

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        by_file: dict[str, list[str]] = {}
        for name in names:
            if name not in self.files:
                raise KeyError(f"tensor {name!r} is not in the checkpoint (it has {len(self.files)} tensors)")
            by_file.setdefault(self.files[name], []).append(name)
        out: dict[str, torch.Tensor] = {}
        for file, wanted in by_file.items():
            with safe_open(file, framework="pt") as handle:
                for name in wanted:
                    out[name] = handle.get_tensor(name).float()
        return out

    def stage_tensors(self, layers: range, embedding: bool, head: bool) -> dict[str, torch.Tensor]:
        """HF tensors of decoder layers `layers` renumbered from 0, plus the embedding and/or the final norm
        and LM head (`lm_head.weight` only when the checkpoint has one: tied models do not)."""
        names = [n for n in self.files if (m := _HF_LAYER.match(n)) and int(m.group(1)) in layers]
        if embedding:
            names.append("model.embed_tokens.weight")
        if head:
            names += [n for n in ("model.norm.weight", "lm_head.weight") if n in self.files]
        tensors = self.read(names)
        renamed = {}
        for name, tensor in tensors.items():
            match = _HF_LAYER.match(name)
            renamed[f"model.layers.{int(match.group(1)) - layers.start}.{match.group(2)}" if match else name] = tensor
        return renamed
