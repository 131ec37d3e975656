"""`FSDPStrategy`: the user's HF model sharded with FSDP2 (fp32 master weights, compute in the strategy's
dtype), the user's optimizer re-pointed at the shards, clipping over all shards, DCP checkpoints.

With `router_aux_loss_coef` a mixture of experts' training forwards of `sequence_log_probs` carry the routers'
load-balancing loss (averaged over the layers, padding left out, as the trainer's FSDP workers) into the backward of
their log-probs, as the Megatron strategy's do; `router_losses` reads it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from workers.fsdp import checkpoint
from workers.fsdp.model_loading import enable_gradient_checkpointing
from workers.fsdp.optim import build_lr_scheduler, build_optimizer, clipped_step
from workers.fsdp.wrap import shard_in_units, units_by_class
from workers.head_log_probs import set_logits_chunk_tokens, token_log_probs_and_entropy
from workers.moe_router_loss import RouterLogits, with_loss_in_backward
from workers.rollout.hybrid import FSDPWeightSource
from workers.rollout.in_process_sync import WeightSource
from workers.strategy.base import Strategy
from workers.strategy.config import optimizer_settings, scheduler_settings


@dataclass
class PreparedModel:
    """What the weight source of a hybrid engine reads from a prepared model (see `FSDPWeightSource`)."""

    module: nn.Module
    model_path: str
    device: torch.device
    dtype: torch.dtype
    lora: None = None  # the strategy API syncs whole models (LoRA runs through the trainer's FSDP actor)
    # The user's code builds the model from its folder as it is: no model.override_config here.
    config_overrides: dict[str, Any] = field(default_factory=dict)

    def synced_parameter_names(self) -> None:
        """What a weight sync sends: every parameter (as `FSDPBackend.synced_parameter_names` without LoRA)."""
        return None


class FSDPStrategy(Strategy):
    backend = "fsdp2"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._routers: dict[int, RouterLogits] = {}  # per trainable model (by id), with router_aux_loss_coef
        # Per model: the sum of its training forwards' losses since router_losses, and their count.
        self._router_sums: dict[int, tuple[torch.Tensor, int]] = {}

    # ---- models ---------------------------------------------------------------------------------------
    def prepare(self, model: nn.Module | str, optimizer: Any = None, scheduler: Any = None) -> Any:
        """Shard `model` (an HF model, or its folder) over all ranks. With `optimizer` (a torch optimizer
        built over `model.parameters()`, or AdamW settings such as {"lr": 1e-5}) the model is trainable and
        `(model, optimizer, scheduler)` is returned; `scheduler` is an LR scheduler of that optimizer or settings
        (`scheduler_settings`). Without an optimizer the model is frozen (compute dtype, eval) and returned alone."""
        trainable = optimizer is not None
        if isinstance(model, str):
            model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32 if trainable else self.dtype)
        if not isinstance(model, nn.Module):
            raise TypeError(f"prepare takes an nn.Module or an HF model folder, got {type(model).__name__}")
        if isinstance(scheduler, dict) and not isinstance(optimizer, (dict, torch.optim.Optimizer)):
            raise ValueError("prepare: scheduler settings need an optimizer")
        names = {id(p): name for name, p in model.named_parameters()}
        if trainable:
            model.to(torch.float32)  # master weights; the mixed-precision policy casts for compute
            if self.config.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
                enable_gradient_checkpointing(model, None)
        else:
            model.to(self.dtype).requires_grad_(False)
        # Units: the model's `_no_split_modules` blocks; a frozen model is already in the compute dtype.
        shard_in_units(model, units_by_class(model), self.device, self.dtype if trainable else None)
        set_logits_chunk_tokens(model, self.config.logits_chunk_tokens)
        model.train(trainable)
        path = getattr(getattr(model, "config", None), "_name_or_path", "")
        self._engines[id(model)] = PreparedModel(model, path, self.device, self.dtype)
        if not trainable:
            return model
        if self.config.router_aux_loss_coef is not None:
            config = getattr(model.config, "text_config", None) or model.config
            top_k = int(getattr(config, "num_experts_per_tok", 0))
            self._routers[id(model)] = RouterLogits(model, top_k, "strategy router_aux_loss_coef")
        if isinstance(optimizer, dict):
            optimizer = build_optimizer(model, optimizer_settings(optimizer))
        elif isinstance(optimizer, torch.optim.Optimizer):
            # FSDP2 replaced each parameter by a sharded one: the optimizer's groups (and any scheduler holding
            # the optimizer) keep working once the groups list the new parameters, matched by name.
            if optimizer.state:
                raise ValueError(
                    "prepare: the optimizer already holds state (it stepped); build it fresh over model.parameters()"
                )
            sharded = dict(model.named_parameters())
            for group in optimizer.param_groups:
                try:
                    group["params"] = [sharded[names[id(p)]] for p in group["params"]]
                except KeyError:
                    raise ValueError(
                        "prepare: the optimizer holds parameters that are not the model's; build it over "
                        "model.parameters() of the model passed to prepare"
                    ) from None
        else:
            raise TypeError(
                "prepare: optimizer must be a torch optimizer or a dict of AdamW settings, "
                f"got {type(optimizer).__name__}"
            )
        if isinstance(scheduler, dict):
            scheduler = build_lr_scheduler(optimizer, scheduler_settings(scheduler))
        return model, optimizer, scheduler

    def sequence_log_probs(
        self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        mask = attention_mask.to(self.device)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        ids = input_ids.to(self.device)
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "use_cache": False}
        # Every position but the last predicts the next token; the LM head scores them a chunk at a time.
        predictors = torch.arange(ids.shape[1] - 1, device=self.device)
        router = self._routers.get(id(model))
        capture = router is not None and model.training and torch.is_grad_enabled()
        with router.capturing() if capture else contextlib.nullcontext():
            log_probs, _ = token_log_probs_and_entropy(model, inputs, predictors, ids[:, 1:], 1.0, with_entropy=False)
        loss = router.balance_loss(mask) if capture else None
        if loss is None:
            return log_probs
        total, count = self._router_sums.get(id(model), (0.0, 0))
        self._router_sums[id(model)] = (loss.detach() + total, count + 1)
        return with_loss_in_backward(log_probs, self.config.router_aux_loss_coef * loss)

    def router_losses(self, model: nn.Module) -> dict[str, float]:
        """`router_aux_loss`: the load-balancing loss of the training forwards since the last call (averaged over the
        layers, the forwards and the ranks; 1.0 is an even load). Collective: call on every rank."""
        if id(model) not in self._routers:
            raise ValueError("router_losses: no router loss is on; set the strategy's router_aux_loss_coef")
        total, count = self._router_sums.pop(id(model), (0.0, 0))
        if count == 0:
            raise ValueError("router_losses: no training forward ran since the last call (model.train(), with grad)")
        return {"router_aux_loss": float(self.all_reduce(total / count, op="mean"))}

    def _step(self, engine: PreparedModel, model: nn.Module, optimizer: Any) -> float:
        return clipped_step(model, optimizer, self.config.grad_clip)

    def weight_source(self, model: nn.Module) -> WeightSource:
        return FSDPWeightSource(self._engine(model, "update_engine_weights"))

    # ---- checkpoint shards ----------------------------------------------------------------------------
    def _save_shards(self, path: str, model: nn.Module, optimizer: Any, scheduler: Any) -> None:
        extra = {"lr_scheduler": scheduler.state_dict()} if scheduler is not None else {}
        checkpoint.save_sharded(path, model, optimizer, extra, self.rank)

    def _load_shards(self, path: str, model: nn.Module, optimizer: Any, scheduler: Any) -> None:
        extra = checkpoint.load_sharded(path, model, optimizer, self.rank)
        if scheduler is not None:
            scheduler.load_state_dict(extra["lr_scheduler"])
