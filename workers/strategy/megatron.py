"""`MegatronStrategy`: a megatron-core GPT model built from an HF folder (TP x DP, a mixture of experts' EP and expert
TP, optional sequence parallelism and distributed optimizer), trained by the user's own forward, loss and backward.

`prepare` returns Megatron's DDP-wrapped model, its optimizer and an LR schedule object; call the model
through `sequence_log_probs` (the logits are split over the TP ranks' vocabulary). On a machine without
a GPU the model runs on CPU over gloo through `workers/megatron/cpu_host.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

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
        settings = ParallelSettings.from_config(dataclasses.asdict(self.config.megatron))
        engine = MegatronBackend({"path": path, "dtype": self.config.dtype}, settings, optim_cfg, seed=self.config.seed)
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
        logits = sequence_forward(model, ids, attention_mask, engine.settings, self.device)[:, :length]
        log_probs, _ = log_probs_and_entropy(logits[:, :-1], ids[:, 1:], engine.layout.vocab_size, with_entropy=False)
        return log_probs

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
