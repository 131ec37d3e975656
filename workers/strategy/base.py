"""`Strategy`: what a user's own training loop inside a `Worker` calls, whatever the backend.

The backend classes (`FSDPStrategy`, `MegatronStrategy`) add model preparation, the log-probs, the optimizer
step itself and the checkpoint shards; this base holds what both share: the process group, collectives, rank-0
printing, backward and the step's bookkeeping, optimizer-state offload (the FSDP workers' `Offloader`), the
inference engine and the atomic checkpoint folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from single_controller.worker import init_default_process_group
from workers.checkpoint_format import load_driver_state
from workers.fsdp.model_loading import compute_dtype, worker_device
from workers.fsdp.offload import Offloader
from workers.rollout.in_process_sync import WeightSource
from workers.strategy import checkpoint_folders
from workers.strategy.config import ENGINE_TYPES, InferenceConfig, StrategyConfig
from workers.strategy.inference import GroupedInferenceEngine

REDUCE_OPS = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


class Strategy:
    """Subclasses implement `prepare` (registering what they build per model in `_engines`), `sequence_log_probs`,
    `weight_source`, `_step` (clip and step, returning the norm) and `_save_shards` / `_load_shards`."""

    backend = ""

    def __init__(self, config: StrategyConfig) -> None:
        self.config = config
        self.setup_distributed()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = worker_device()
        self.dtype = compute_dtype(config.dtype, self.device)
        self.inference: GroupedInferenceEngine | None = None
        self.grad_norms: dict[str, float] = {}  # the last grad norm per optimizer_step name
        self._engines: dict[int, Any] = {}  # per prepared model (by id): what the backend built for it
        self._offloaders: dict[int, Offloader] = {}  # per optimizer (by id), with optimizer_offload: its host buffers
        torch.manual_seed(config.seed)

    # ---- distributed ----------------------------------------------------------------------------------
    def setup_distributed(self) -> None:
        """Join the worker group's process group (nccl with a GPU, gloo otherwise); a no-op when joined.
        The worker group sets RANK, WORLD_SIZE, LOCAL_RANK and the master address on every worker."""
        init_default_process_group()

    def is_rank_0(self) -> bool:
        return self.rank == 0

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.rank == 0:
            print(*args, **kwargs, flush=True)

    def barrier(self) -> None:
        dist.barrier()

    def all_reduce(self, value: Any, op: str = "mean") -> Any:
        """A number, tensor, or dict of them reduced over all ranks (`op`: "mean", "sum" or "max"); same type back."""
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce op {op!r} is not valid; valid: {sorted(REDUCE_OPS)}")
        if isinstance(value, dict):
            return {key: self.all_reduce(item, op) for key, item in value.items()}
        is_tensor = isinstance(value, torch.Tensor)
        if not is_tensor and not isinstance(value, (int, float)):
            raise TypeError(f"all_reduce takes a number, a tensor or a dict of them, got {type(value).__name__}")
        if not is_tensor:
            tensor = torch.tensor(float(value), dtype=torch.float64, device=self.device)
        else:
            tensor = value.detach().clone().to(self.device)
            if op == "mean" and not tensor.is_floating_point():
                tensor = tensor.double()
        dist.all_reduce(tensor, op=REDUCE_OPS[op])
        if op == "mean":
            tensor /= self.world_size
        return tensor.to(value.device) if is_tensor else tensor.item()

    def all_gather(self, value: Any) -> Any:
        """Tensors of one shape: concatenated along dim 0 in rank order; a dict: per key; anything else (numbers,
        lists, strings): a list with one entry per rank."""
        if isinstance(value, dict):
            return {key: self.all_gather(item) for key, item in value.items()}
        if isinstance(value, torch.Tensor):
            local = value.detach().to(self.device).contiguous()
            pieces = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(pieces, local)
            return torch.cat([p.reshape(-1, *local.shape[1:]) if local.dim() else p.reshape(1) for p in pieces]).to(
                value.device
            )
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    # ---- models and steps ------------------------------------------------------------------------------
    def prepare(self, model: Any, optimizer: Any = None, scheduler: Any = None) -> Any:
        raise NotImplementedError

    def sequence_log_probs(
        self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """log p(token_t | tokens_<t) [B, L-1] of left- or right-padded rows, with the graph for backward."""
        raise NotImplementedError

    def weight_source(self, model: nn.Module) -> WeightSource:
        raise NotImplementedError

    def _engine(self, model: nn.Module, method: str) -> Any:
        engine = self._engines.get(id(model))
        if engine is None:
            raise ValueError(
                f"{method}: this model was not prepared by the strategy; call strategy.prepare(model, ...) first"
            )
        return engine

    def backward(self, loss: torch.Tensor, model: nn.Module, optimizer: Any) -> None:
        """Gradients of `loss`. FSDP2 reduce-scatters them over the ranks (averaged) as backward runs; Megatron
        accumulates them into its fp32 buffers, which `optimizer_step` reduces over DP."""
        loss.backward()

    def optimizer_step(self, optimizer: Any, model: nn.Module, scheduler: Any = None, name: str = "model") -> float:
        """Clip the global gradient norm to `grad_clip`, step (skipped when the norm is not finite, on every
        rank alike), zero the gradients, step the scheduler; returns the norm before clipping."""
        engine = self._engine(model, "optimizer_step")
        if self._on_host(optimizer):
            raise RuntimeError(
                f"optimizer_step({name!r}): the optimizer state is offloaded; call maybe_load_optimizer first"
            )
        grad_norm = self._step(engine, model, optimizer)
        if scheduler is not None:
            scheduler.step()
        self.grad_norms[name] = grad_norm
        return grad_norm

    # ---- optimizer offload ----------------------------------------------------------------------------
    def _on_host(self, optimizer: Any) -> bool:
        offloader = self._offloaders.get(id(optimizer))
        return offloader is not None and not offloader.optimizer_on_device

    def maybe_offload_optimizer(self, optimizer: Any) -> None:
        """With `optimizer_offload`, move the optimizer's state (Adam moments, step counts) to host memory: the
        storages move, the tensors stay, so loading it back gives bit-identical state (on CPU too)."""
        if self.config.optimizer_offload:
            if id(optimizer) not in self._offloaders:
                self._offloaders[id(optimizer)] = Offloader(None, optimizer, self.device, False, True, move_on_cpu=True)
            self._offloaders[id(optimizer)].offload_optimizer()

    def maybe_load_optimizer(self, optimizer: Any) -> None:
        """Bring offloaded optimizer state back to the device before a step (a no-op when it is there)."""
        if id(optimizer) in self._offloaders:
            self._offloaders[id(optimizer)].load_optimizer()

    # ---- inference engine -----------------------------------------------------------------------------
    def setup_inference_engine(self, config: Any, engine_type: str = "vllm") -> None:
        """An in-process engine (vLLM or HF generate) on the first rank of every `group_size` ranks."""
        if engine_type not in ENGINE_TYPES:
            raise ValueError(f"engine_type {engine_type!r} is not available; valid: {list(ENGINE_TYPES)}")
        cfg = InferenceConfig.parse(config)
        dtype = self.dtype if cfg.dtype == "auto" else compute_dtype(cfg.dtype, self.device)
        self.inference = GroupedInferenceEngine(cfg, engine_type, dtype, self.device, self.config.seed)

    def _require_inference(self, method: str) -> GroupedInferenceEngine:
        if self.inference is None:
            raise RuntimeError(f"{method}: call setup_inference_engine(config, engine_type) first")
        return self.inference

    def gather_and_generate(
        self, prompts: list[list[int]], sampling: dict[str, Any] | None = None
    ) -> list[dict[str, list]]:
        """This rank's prompts (token-id lists) -> per prompt `token_ids` and `log_probs`, in order. `sampling`:
        vLLM `SamplingParams` fields (temperature, top_p, top_k, max_tokens, stop_token_ids, ...). Collective
        over the engine group."""
        return self._require_inference("gather_and_generate").gather_and_generate(prompts, dict(sampling or {}))

    def update_engine_weights(self, model: nn.Module) -> dict[str, float]:
        """Stream `model`'s weights into the engines and verify them; returns sync metrics. Collective."""
        return self._require_inference("update_engine_weights").update(self.weight_source(model))

    def wakeup_inference_engine(self) -> None:
        self._require_inference("wakeup_inference_engine").wake_up()

    def maybe_sleep_inference_engine(self) -> None:
        """GPU with `enable_sleep`: release the engine's memory (vLLM: weights and KV cache; the next
        `update_engine_weights` re-sends the weights). A no-op on CPU."""
        self._require_inference("maybe_sleep_inference_engine").sleep()

    # ---- checkpoints ----------------------------------------------------------------------------------
    def save_checkpoint(
        self,
        root: str,
        step: int,
        model: nn.Module,
        optimizer: Any,
        scheduler: Any = None,
        client_state: dict[str, Any] | None = None,
        keep: int | None = None,
    ) -> str:
        """Write `root/global_step_<step>/` atomically (the toolkit's format: a temporary folder, a manifest,
        a rename): model and optimizer shards, the scheduler, RNG states and `client_state` (JSON). With `keep`,
        only the newest `keep` checkpoints stay. Collective; returns the folder."""
        # Shards are written from the device state: offloaded optimizer state comes back for the save only.
        offloaded = self._on_host(optimizer)
        self.maybe_load_optimizer(optimizer)
        folder = checkpoint_folders.save(
            root, step, client_state or {}, keep, lambda path: self._save_shards(path, model, optimizer, scheduler)
        )
        if offloaded:
            self.maybe_offload_optimizer(optimizer)
        return folder

    def load_checkpoint(
        self, path: str, model: nn.Module, optimizer: Any, scheduler: Any = None
    ) -> dict[str, Any] | None:
        """Restore from a step folder, or from the newest whole one under a root; returns its `client_state`,
        or None when the root holds no checkpoint. Collective."""
        folder = checkpoint_folders.resolve(Path(path))
        if folder is None:
            return None
        self.maybe_load_optimizer(optimizer)
        self._load_shards(str(folder), model, optimizer, scheduler)
        return load_driver_state(folder)
