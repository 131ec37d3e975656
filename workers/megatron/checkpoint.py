"""A `MegatronBackend`'s checkpoint: one file per distinct (tensor, pipeline, expert, expert-tensor) coordinate of the
ranks, written by the lowest rank holding it (the model slice, the optimizer, the LR position, the RNG state and the
caller's `extra`), and with the distributed optimizer one file per rank of the optimizer state it holds
(workers/megatron/optimizer_shards.py). Read back with the tensor, pipeline and expert sizes it was saved with; the
data-parallel size may change."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from workers.megatron.model import RankCoordinate
from workers.megatron.optimizer_shards import load_optimizer_slices, save_optimizer_slices

# `backend` below is a workers.megatron.backend.MegatronBackend (not imported: it imports this module).


def _shard_file(backend: Any, path: str, kind: str) -> str:
    rank, settings = RankCoordinate.current(), backend.settings
    # Expert parallel ranks of one TP x PP coordinate hold different experts: one file each. With an expert-TP size
    # of its own ("parallel folding") ranks of one TP coordinate may also hold different slices of the same experts.
    ep = f"_ep{rank.ep_rank}" if settings.ep > 1 else ""
    etp = f"_etp{rank.etp_rank}" if settings.expert_tp != settings.tp else ""
    return os.path.join(path, f"{kind}_tp{rank.tp_rank}_pp{rank.pp_rank}{ep}{etp}.pt")


def _writes_model_shard(backend: Any) -> bool:
    """One rank per file: the lowest rank of each coordinate (its data-parallel copies hold the same state)."""
    coordinates: list[RankCoordinate | None] = [None] * dist.get_world_size()
    dist.all_gather_object(coordinates, RankCoordinate.current())
    return coordinates.index(coordinates[dist.get_rank()]) == dist.get_rank()


def save_megatron_checkpoint(backend: Any, path: str, extra: dict[str, Any] | None) -> None:
    os.makedirs(path, exist_ok=True)
    if backend.settings.use_distributed_optimizer:
        save_optimizer_slices(backend, path)
    if _writes_model_shard(backend):
        state = {
            "model": {k: v for k, v in backend.gpt.state_dict().items() if not k.endswith("_extra_state")},
            "optimizer": backend.optimizer.state_dict(),
            "lr_steps": backend.steps,
            "torch_rng": torch.get_rng_state(),
            "extra": dict(extra or {}),
        }
        torch.save(state, _shard_file(backend, path, "model_optim"))
    dist.barrier()


def load_megatron_checkpoint(backend: Any, path: str) -> dict[str, Any]:
    """Restores the model, the optimizer, the LR position (`backend.steps`) and the RNG state; returns `extra`."""
    file = _shard_file(backend, path, "model_optim")
    if not os.path.exists(file):
        settings = backend.settings
        folding = (
            f", expert_tp={settings.expert_tp}; with an expert-TP size other than TP a data-parallel size whose ranks "
            "pair TP and expert ranks differently from the saving run's cannot read it"
            if settings.expert_tp != settings.tp else ""
        )
        raise FileNotFoundError(
            f"{file} not found: a Megatron checkpoint is read with the TP/PP/EP sizes it was saved with "
            f"(tp={settings.tp}, pp={settings.pp}, ep={settings.ep}{folding} here; the data-parallel size may differ)"
        )
    state = torch.load(file, map_location="cpu", weights_only=True)
    backend.gpt.load_state_dict(state["model"], strict=False)
    backend.optimizer.load_state_dict(state["optimizer"])
    if backend.settings.use_distributed_optimizer:
        load_optimizer_slices(backend, path)
    backend.steps = int(state["lr_steps"])
    torch.set_rng_state(state["torch_rng"])
    return state["extra"]
