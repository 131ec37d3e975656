"""`MegatronStrategy`: a megatron-core GPT model built from an HF folder (TP x DP, a mixture of experts' EP and expert
TP, optional sequence parallelism and distributed optimizer), trained by the user's own forward, loss and backward.

`prepare` returns Megatron's DDP-wrapped model, its optimizer and an LR schedule object; call the model
through `sequence_log_probs` (the logits are split over the TP ranks' vocabulary). On a machine without
a GPU the model runs on CPU over gloo through `workers/megatron/cpu_host.py`.

A mixture of experts' routers train with megatron-core's own losses when `router_aux_loss_coef` (averaged over the
layers) or `megatron.moe_aux_loss_coeff` (per layer) / `moe_z_loss_coeff` are set: each training forward of
`sequence_log_probs` attaches them to the routers' outputs, so the user's `backward` carries their gradient (each
forward's at its full coefficient: a loop that averages its loss over k micro-batches divides the coefficients by k
for the same mean); `router_losses` reads their values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from workers.megatron.router_training import RouterTraining, router_loss_metrics, set_router_loss_scale
from workers.rollout.in_process_sync import WeightSource
from workers.strategy.base import Strategy
from workers.strategy.config import optimizer_settings, scheduler_settings


class MegatronLRSchedule:
    """The engine's warmup + constant/cosine schedule behind the usual `step()` / `get_last_lr()`."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def step(self) -> None:
        self.engine.lr_scheduler_step()

    def get_last_lr(self) -> list[float]:
        return [self.engine.current_lr()]


class MegatronStrategy(Strategy):
    backend = "megatron"

    def __init__(self, config: Any) -> None:
        from workers.megatron.parallel import init_megatron_groups

        super().__init__(config)
        self._router_forwards: dict[int, int] = {}  # per prepared model (by id): training forwards with router losses
        layout = config.megatron
        init_megatron_groups(
            self.world_size, layout.tensor_model_parallel_size, 1, layout.expert_model_parallel_size,
            layout.expert_tensor_parallel_size,
        )

    def prepare(self, model: Any, optimizer: Any = None, scheduler: Any = None) -> Any:
        """`model`: an HF model folder (or an HF model loaded from one: its folder is read). `optimizer` and
        `scheduler`: settings dicts as `FSDPStrategy.prepare` takes them (Megatron builds its own optimizer over
        fp32 main weights). Returns `(model, optimizer, schedule)`, or the frozen model without an optimizer."""
        from workers.megatron.backend import MegatronBackend
        from workers.megatron.model import ParallelSettings

        path = model if isinstance(model, str) else getattr(getattr(model, "config", None), "_name_or_path", "")
        if not path:
            raise ValueError("MegatronStrategy.prepare needs an HF model folder (or a model loaded from one)")
        if optimizer is not None and not isinstance(optimizer, dict):
            raise TypeError(f"MegatronStrategy.prepare takes optimizer settings as a dict (e.g. {{'lr': 1e-5}}), got "
                            f"{type(optimizer).__name__}: Megatron builds its own distributed optimizer")
        optim_cfg = None
        if optimizer is not None:
            optim_cfg = {**optimizer_settings(optimizer), **scheduler_settings(scheduler or {})}
        layout = self.config.megatron
        settings = ParallelSettings.from_config(dataclasses.asdict(layout))
        averaged = self.config.router_aux_loss_coef  # the trainer's meaning: RouterTraining divides by the layers
        router = RouterTraining(
            aux_loss_coeff=layout.moe_aux_loss_coeff if averaged is None else averaged,
            averaged_over_layers=averaged is not None, z_loss_coeff=layout.moe_z_loss_coeff,
            router_dtype=layout.moe_router_dtype,
        )
        engine = MegatronBackend(
            {"path": path, "dtype": self.config.dtype}, settings, optim_cfg, seed=self.config.seed, router=router
        )
        self._engines[id(engine.model)] = engine
        if optim_cfg is None:
            return engine.model
        return engine.model, engine.optimizer, MegatronLRSchedule(engine)

    def sequence_log_probs(
        self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        from workers.megatron.rows_forward import sequence_forward
        from workers.megatron.vocab_parallel import log_probs_and_entropy

        engine = self._engine(model, "sequence_log_probs")
        ids, length = input_ids.to(self.device), input_ids.shape[1]
        tracks = engine.router.tracks_losses
        if tracks and model.training and torch.is_grad_enabled():  # megatron-core adds the router losses
            self._router_forwards[id(model)] = self._router_forwards.get(id(model), 0) + 1
            set_router_loss_scale(1.0, self.device)  # each forward's at its coefficient, whatever ran before
        logits = sequence_forward(model, ids, attention_mask, engine.settings, self.device, tracks)[:, :length]
        log_probs, _ = log_probs_and_entropy(logits[:, :-1], ids[:, 1:], engine.layout.vocab_size, with_entropy=False)
        return log_probs

    def router_losses(self, model: nn.Module) -> dict[str, float]:
        """The router losses of the training forwards since the last call, as the workers log them:
        `router_aux_loss` (load balancing, per layer; 1 for an even load) and `router_z_loss`, each averaged over the
        layers, those forwards and the data-parallel ranks; only the losses that are on. Collective: call on every
        rank."""
        engine = self._engine(model, "router_losses")
        if not engine.router.tracks_losses:
            raise ValueError(
                "router_losses: no router loss is on; set router_aux_loss_coef (or megatron.moe_aux_loss_coeff) "
                "and/or megatron.moe_z_loss_coeff"
            )
        forwards = self._router_forwards.pop(id(model), 0)
        if forwards == 0:
            raise ValueError("router_losses: no training forward ran since the last call (model.train(), with grad)")
        # Equal over a model-parallel group already: the mean over all ranks is the mean over data parallelism.
        return self.all_reduce(router_loss_metrics(engine.router, forwards, engine.layout.num_layers, self.device))

    def _step(self, engine: Any, model: nn.Module, optimizer: Any) -> float:
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([model])  # DP all-reduce (averaged), sequence-parallel norm grads over TP
        grad_norm = engine.optimizer_step(self.config.grad_clip)
        engine.zero_grad()
        return grad_norm

    def weight_source(self, model: nn.Module) -> WeightSource:
        from workers.megatron.rollout_source import MegatronWeightSource

        return MegatronWeightSource(self._engine(model, "update_engine_weights"))

    def _save_shards(self, path: str, model: nn.Module, optimizer: Any, scheduler: Any) -> None:
        self._engine(model, "save_checkpoint").save_checkpoint(path)

    def _load_shards(self, path: str, model: nn.Module, optimizer: Any, scheduler: Any) -> None:
        self._engine(model, "load_checkpoint").load_checkpoint(path)  # restores the LR position too
