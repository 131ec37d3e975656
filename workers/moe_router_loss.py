"""The routers' load-balancing loss of a Hugging Face mixture-of-experts model (`actor.router_aux_loss_coef`).

Hugging Face models declare where their router logits come from (`_can_record_outputs["router_logits"]`: the
router module class and which of its outputs); forward hooks on those modules keep each layer's logits while a
training forward runs, and the loss is computed from them after it. Hooks rather than `output_router_logits=True`
leave every forward path (packed, padded, chunked log-probs, Ulysses) as it is. A layer recomputed in the backward
(gradient checkpointing) runs its router again; captures outside a training forward are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

ROUTER_OUTPUT_KEY = "router_logits"  # the key of transformers' `_can_record_outputs`


def router_source(model: nn.Module) -> tuple[type, int] | None:
    """(router module class, index of the logits in its output) that the model declares, or None (dense)."""
    for module in model.modules():
        recorded = getattr(type(module), "_can_record_outputs", None) or {}
        source = recorded.get(ROUTER_OUTPUT_KEY)
        if source is None:
            continue
        if isinstance(source, type):
            return source, 0
        return source.target_class, source.index
    return None


def has_router(model: nn.Module) -> bool:
    return router_source(model) is not None


def load_balance_loss(layer_logits: list[torch.Tensor], top_k: int, token_mask: torch.Tensor | None) -> torch.Tensor:
    """Switch Transformer's load-balancing loss, averaged over the MoE layers: per layer, the number of experts
    times the sum over experts of (share of the token's top-k assignments routed to it) x (its mean routing
    probability). Uniform routing gives 1; routing everything to k experts gives about experts / k.
    `token_mask` [tokens] (1 = a real token) leaves padding out."""
    losses = []
    for logits in layer_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        experts = probs.shape[-1]
        chosen = torch.zeros_like(probs).scatter_(-1, probs.topk(top_k, dim=-1).indices, 1.0)
        weights = torch.ones(probs.shape[0], device=probs.device) if token_mask is None else token_mask.float()
        tokens = weights.sum().clamp(min=1.0)
        assigned_share = (chosen * weights[:, None]).sum(0) / (tokens * top_k)
        mean_prob = (probs * weights[:, None]).sum(0) / tokens
        losses.append(experts * (assigned_share * mean_prob).sum())
    return torch.stack(losses).mean()


class RouterLogits:
    """Keeps each MoE layer's router logits during `capturing()`; `balance_loss` turns them into the loss."""

    def __init__(self, model: nn.Module, top_k: int, setting: str = "actor.router_aux_loss_coef") -> None:
        source = router_source(model)
        if source is None:
            raise ValueError(
                f"{setting} is set, but {type(model).__name__} declares no mixture-of-experts router "
                f"(a dense model); leave {setting} unset"
            )
        router_class, self.index = source
        self.top_k = top_k
        self.active = False
        self.layer_logits: list[torch.Tensor] = []
        self.routers = [module for module in model.modules() if isinstance(module, router_class)]
        for router in self.routers:
            router.register_forward_hook(self._keep)

    def _keep(self, module: nn.Module, inputs: tuple, output: object) -> None:
        if self.active:
            self.layer_logits.append(output[self.index] if isinstance(output, (tuple, list)) else output)

    @contextmanager
    def capturing(self) -> Iterator[None]:
        self.layer_logits, self.active = [], True
        try:
            yield
        finally:
            self.active = False

    def balance_loss(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The captured forward's loss (None when no router ran). `attention_mask` [b, L] applies when the routers
        saw the padded rows (b x L tokens); packed rows hold real tokens only."""
        logits, self.layer_logits = self.layer_logits, []
        if not logits:
            return None
        mask = None
        if attention_mask is not None and attention_mask.numel() == logits[0].shape[0]:
            mask = attention_mask.reshape(-1).to(logits[0].device)
        return load_balance_loss(logits, self.top_k, mask)


class _LossInBackward(torch.autograd.Function):
    """The identity on `output`; its backward also gives `loss` the gradient 1, so whatever backward passes through
    `output` minimises `loss` too (megatron-core attaches its routers' losses to their outputs the same way)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(loss)
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        (loss,) = ctx.saved_tensors
        return grad_output, torch.ones_like(loss)


def with_loss_in_backward(output: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """`output`, carrying `loss` into any backward through it (the strategy API's router loss)."""
    return _LossInBackward.apply(output, loss)
