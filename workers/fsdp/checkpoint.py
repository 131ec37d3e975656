"""Sharded checkpoints (torch.distributed.checkpoint), per-rank RNG/scheduler state, and HF export.

Layout of a checkpoint directory:
    model_optim/              DCP shards of {"model": ..., "optimizer": ...} (every rank writes its shard)
    extra_state_rank{r}.pt    lr scheduler, RNG states and worker counters of rank r; only tensors, lists,
                              dicts and numbers, so `torch.load(weights_only=True)` reads it
"""

from __future__ import annotations

import copy
import glob
import os
import random
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

DCP_SUBDIR = "model_optim"
# Tokenizer (and a vision-language model's processor) files copied next to an exported model, so the export is
# usable on its own.
TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template*",
    "*.tiktoken",
    "spiece.model",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
)


def extra_state_path(path: str, rank: int | str) -> str:
    return os.path.join(path, f"extra_state_rank{rank}.pt")


def rng_state() -> dict[str, Any]:
    """Every RNG a worker draws from, in a weights_only-loadable form (numpy's key array as a tensor)."""
    kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(position),
                  "has_gauss": int(has_gauss), "cached_gauss": float(cached_gauss)},
        "python": {"version": version, "state": list(python_state), "gauss_next": gauss_next},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))


def _options(trainable_only: bool) -> StateDictOptions:
    # Frozen parameters (a LoRA run's base weights) come from the model folder, not from the checkpoint.
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def _state_dicts(
    model: nn.Module, optimizer: torch.optim.Optimizer, trainable_only: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(trainable_only))
    if trainable_only:  # ignore_frozen_params keeps a frozen tied weight under its second name (lm_head)
        trainable = {name for name, param in model.named_parameters() if param.requires_grad}
        model_sd = {name: value for name, value in model_sd.items() if name in trainable}
    return model_sd, optim_sd


def save_sharded(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    rank: int,
    trainable_only: bool = False,
) -> None:
    """Collective: every rank writes its model/optimizer shard and its own extra state. With
    `trainable_only`, frozen parameters are left out (they are reloaded from the model folder)."""
    os.makedirs(path, exist_ok=True)
    model_sd, optim_sd = _state_dicts(model, optimizer, trainable_only)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=os.path.join(path, DCP_SUBDIR))
    torch.save({**extra, "rng": rng_state()}, extra_state_path(path, rank))
    dist.barrier()  # the checkpoint is complete only when every rank has written


def _extra_state_file(path: str, rank: int) -> str:
    """Rank `rank`'s extra state. A world larger than the one that saved (a run grown back after a node loss)
    reads rank `rank % saved ranks`'s: the LR schedule and counters are the same on every rank, and the
    model and optimizer shards are resharded by DCP; those ranks then share an RNG state."""
    own = extra_state_path(path, rank)
    if os.path.isfile(own):
        return own
    saved = len(glob.glob(extra_state_path(path, "*")))
    if saved == 0:
        raise FileNotFoundError(f"no checkpoint at {path!r}: it holds no extra_state_rank*.pt file")
    return extra_state_path(path, rank % saved)


def load_sharded(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rank: int,
    trainable_only: bool = False,
    must_match: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Collective: restore model, optimizer and RNG states; returns the extra state saved by `save_sharded`.
    `must_match` entries (e.g. the LoRA settings) must equal the saved extra state's, or it raises naming them."""
    extra = torch.load(_extra_state_file(path, rank), weights_only=True)
    for key, expected in (must_match or {}).items():
        if extra.get(key) != expected:
            raise ValueError(
                f"checkpoint {path!r} was saved with {key}={extra.get(key)!r}, this run has {key}={expected!r}; "
                "resume with the same settings"
            )
    # The templates tell DCP which shard of each tensor this rank reads (the optimizer state is created).
    model_sd, optim_sd = _state_dicts(model, optimizer, trainable_only)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=os.path.join(path, DCP_SUBDIR))
    options = _options(trainable_only)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"], options=options
    )
    set_rng_state(extra.pop("rng"))
    for key in must_match or {}:
        extra.pop(key, None)
    return extra


def full_state_dict_on_rank0(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded state dict, on CPU, on rank 0 (empty on the other ranks)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def export_hf(model: nn.Module, auto_class: Any, path: str, source_path: str, rank: int) -> None:
    """Collective: write `model` as a plain HF checkpoint (safetensors) into `path` from rank 0."""
    state = full_state_dict_on_rank0(model)
    if rank == 0:
        save_hf_folder(state, auto_class, copy.deepcopy(model.config), path, source_path)
    dist.barrier()  # callers may read the export as soon as any rank returns


def save_hf_folder(state: dict[str, torch.Tensor], auto_class: Any, config: Any, path: str, source_path: str) -> None:
    """Write `state` (HF names) as an HF checkpoint of `auto_class(config)` into `path`.

    A fresh model is built on the meta device and takes the tensors by assignment, so the caller's copy is
    the only one; tokenizer files found in `source_path` are copied along.
    """
    with torch.device("meta"):
        plain = auto_class.from_config(config)
    plain.load_state_dict(state, strict=False, assign=True)
    missing = [name for name, p in plain.named_parameters() if p.is_meta]
    if missing:
        plain.tie_weights()  # the state may hold a tied weight under one name only
        missing = [name for name, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"export_hf: the gathered weights lack {missing}")
    plain.save_pretrained(path)
    copy_tokenizer_files(source_path, path)


def copy_tokenizer_files(source: str, target: str) -> list[str]:
    """Copy tokenizer files of a local model directory (nothing for hub ids)."""
    if not os.path.isdir(source):
        return []
    copied = []
    for pattern in TOKENIZER_PATTERNS:
        for file in glob.glob(os.path.join(source, pattern)):
            if os.path.isfile(file):
                shutil.copy2(file, target)
                copied.append(os.path.basename(file))
    return copied
