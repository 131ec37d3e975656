"""One copy of a LoRA actor's frozen base weights on the device, held by its hybrid vLLM engine.

A LoRA actor never changes its base, and its in-process vLLM engine loaded the same folder in the same
dtype. With `rollout.share_base_weights` (null: wherever possible) each frozen base parameter's local shard
is re-pointed at this rank's rows of the engine's tensor holding it (workers/fsdp/shared_storage.py), after
checking that the values are equal; the trainer's own copy is then freed. The engine's fused weights
(`qkv_proj`, `gate_up_proj`) and padded vocabulary are read as views under the checkpoint's names
(workers/rollout/vllm_base_views.py), so every base tensor of a Qwen2/Llama model is shared; so are a mixture of
experts' fused experts (vLLM's `w13_weight` / `w2_weight` are transformers' `gate_up_proj` / `down_proj`), at
tensor parallel 1 only. Only the
adapters stay the trainer's: they are what the weight sync sends and what the offloader moves; the shared
storages never move (`stays`), and the engine's sleep frees only its KV cache (workers/rollout/kv_sleep.py).

With an engine of tensor parallel k held as one shard per trainer rank (workers/rollout/engine_shards.py) the
actor's FSDP shard group must be the engine's k ranks (`actor.fsdp_config.fsdp_size` = k): rank r's base shards are
then engine shard r's weights, which are those tensors themselves (a column-parallel weight's rows, the vocabulary's
rows), a window of them (the replicated norms) or, for the linears the engine splits along their input, the weight
itself once FSDP shards those on dim 1 (`row_parallel_placement`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import Shard

from workers.fsdp.offload import GIB
from workers.fsdp.shared_storage import fsdp_params, local_shard, point_shard_at, rows_of, why_not_shareable
from workers.lora.spec import BASE_LAYER, base_sharing_problems

SETTING = "rollout.share_base_weights"
# The linears a tensor-parallel vLLM engine splits along their input dimension (its RowParallelLinear): attention's
# output and the MLP's down projection of the Qwen2/Llama families.
ROW_PARALLEL_LINEARS = ("o_proj", "down_proj")


def resolve_base_sharing(
    config: Mapping[str, Any], trainer_dtype: torch.dtype, engine_dtype: torch.dtype, shard_ranks: int = 1,
    where: str = "", experts: bool = False,
) -> bool:
    """Whether this actor shares its base with its engine: `rollout.share_base_weights` null means where
    the config allows it; true where it does not is a ValueError (the config check catches most cases
    before Ray starts; the dtypes "auto" and the ranks of fsdp_size=-1 resolve only here). `shard_ranks`: the
    ranks the actor's FSDP shards span (with an engine of tensor parallel k > 1 they must be its k ranks);
    `experts`: the model is a mixture of experts (shared at tensor parallel 1 only)."""
    setting = config["rollout"]["share_base_weights"]
    if setting is False:
        return False
    problems = base_sharing_problems(config, where, shard_ranks, experts)
    key = f"{where}." if where else ""
    if trainer_dtype != engine_dtype:
        problems.append(
            f"the engine computes in {engine_dtype} ({key}rollout.dtype) and the actor's base is {trainer_dtype}"
        )
    if problems and setting is True:
        raise ValueError(
            f"{SETTING}=true cannot share the actor's base weights with the rollout engine: {'; '.join(problems)}"
        )
    return not problems


def row_parallel_base_wanted(config: Mapping[str, Any], shard_ranks: int, experts: bool = False) -> bool:
    """Whether the actor's base should be sharded as a tensor-parallel engine holds it (`row_parallel_placement`):
    sharing is not turned off, the config allows it, and the FSDP shard group of `shard_ranks` is the engine's."""
    tp = config["rollout"]["tensor_model_parallel_size"]
    wanted = config["rollout"]["share_base_weights"] is not False and tp > 1
    return wanted and not base_sharing_problems(config, shard_ranks=shard_ranks, experts=experts)


def row_parallel_placement(model: nn.Module) -> Callable[[nn.Parameter], Shard | None]:
    """FSDP2's `shard_placement_fn` for a base shared with an engine of tensor parallel k (the shard group's size):
    the frozen weights of the linears vLLM splits along their input (`ROW_PARALLEL_LINEARS`) are sharded on dim 1,
    so each rank's shard is its engine shard's [out, in / k] weight; every other parameter on dim 0 (FSDP's
    default), which is what vLLM does with the other linears' weights and the vocabulary."""
    names = {id(param): checkpoint_name(name) for name, param in model.named_parameters()}

    def placement(param: nn.Parameter) -> Shard | None:
        owner, _, leaf = names.get(id(param), "").rpartition(".")
        row_parallel = owner.rpartition(".")[2] in ROW_PARALLEL_LINEARS and leaf == "weight"
        return Shard(1) if row_parallel and not param.requires_grad else None

    return placement


def checkpoint_name(trainer_name: str) -> str:
    """A base parameter's name in the checkpoint (peft's adapted linears hold the original as `base_layer`)."""
    return trainer_name.replace(BASE_LAYER, "")


@dataclass
class SharingReport:
    """Bytes of this rank's frozen base shards that are views of the engine's tensors, and why the others are not."""

    shared_bytes: int = 0
    base_bytes: int = 0
    shared: list[str] = field(default_factory=list)
    unshared: dict[str, str] = field(default_factory=dict)  # trainer name -> reason

    @property
    def fraction(self) -> float:
        return self.shared_bytes / self.base_bytes if self.base_bytes else 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "lora/shared_base_gib": self.shared_bytes / GIB,
            "lora/shared_base_fraction": self.fraction,
            "lora/unshared_base_tensors": float(len(self.unshared)),
        }

    def summary(self) -> str:
        text = (
            f"LoRA base shared with the vLLM engine: {_size(self.shared_bytes)} of {_size(self.base_bytes)} "
            "on this rank"
        )
        if self.unshared:
            listed = "; ".join(f"{name}: {why}" for name, why in list(self.unshared.items())[:5])
            more = f" (and {len(self.unshared) - 5} more)" if len(self.unshared) > 5 else ""
            text += f"; not shared: {listed}{more}"
        return text


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.2f} MiB"


class SharedBase:
    """The frozen base parameters of a LoRA actor (FSDP2), to be pointed into its engine's tensors.

    Until `attach` the offloader leaves them alone (`stays`), so they are on the device when the engine has
    started and their values can be compared; after it `stays` names the engine storages they point into."""

    def __init__(self, module: nn.Module) -> None:
        self.params = {name: p for name, p in fsdp_params(module).items() if not p.sharded_param.requires_grad}
        if not self.params:
            raise ValueError("the actor has no frozen parameters: only a LoRA actor's base can be shared")
        self._staying = {local_shard(p).untyped_storage().data_ptr() for p in self.params.values()}
        self.report: SharingReport | None = None

    def stays(self, storage: torch.UntypedStorage) -> bool:
        """Whether the offloader must leave `storage` where it is."""
        return storage.data_ptr() in self._staying

    @torch.no_grad()
    def attach(self, engine_tensors: Mapping[str, torch.Tensor]) -> SharingReport:
        """Point every base shard whose checkpoint name the engine holds, with equal values, at the engine's
        tensor. `engine_tensors`: checkpoint name -> the engine's whole tensor (a view)."""
        report = SharingReport()
        engine_storages: set[int] = set()
        for name, param in self.params.items():
            local = local_shard(param)
            nbytes = local.numel() * local.element_size()
            report.base_bytes += nbytes
            whole = engine_tensors.get(checkpoint_name(name))
            reason = "the engine has no tensor of this name" if whole is None else why_not_shareable(param, whole)
            if reason is None and not torch.equal(local, rows_of(param, whole)):
                reason = "its values differ from the engine's (another layout or rounding)"
            if reason is not None:
                report.unshared[name] = reason
                continue
            point_shard_at(param, whole)
            engine_storages.add(whole.untyped_storage().data_ptr())
            report.shared.append(name)
            report.shared_bytes += nbytes
        # The trainer's own storages of the shared shards are gone; their addresses may be reused by anyone.
        self._staying = engine_storages
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if report.unshared:
            print(f"note: {report.summary()}", file=sys.stderr)
        self.report = report
        return report
