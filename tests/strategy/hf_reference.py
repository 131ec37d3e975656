"""One training step of the HF model itself, the reference the strategy tests compare a strategy's step with."""

import torch

from tests.megatron.moe_models import per_expert_state, qwen3_moe
from tests.strategy.workers import LR


def hf_step(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, router_losses=None, per_expert=True) -> dict:
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, :-1]
    log_probs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    weights = (mask[:, 1:] * mask[:, :-1]).float()  # a real token after real context
    loss = -(log_probs * weights).sum() / weights.sum()
    (loss + (router_losses(mask) if router_losses else 0.0)).backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0).step()
    moe = model.config.model_type == "qwen3_moe"
    weights = per_expert_state(model) if moe and per_expert else model.state_dict()
    return {"loss": loss.item(), "grad_norm": grad_norm, "weights": weights}


def moe_and_rows(folder: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A 2-layer Qwen3 mixture of experts saved to `folder`, and three rows of 10 tokens, the first left-padded by 3."""
    model = qwen3_moe(folder, layers=2)
    torch.manual_seed(1)
    ids = torch.randint(1, 100, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return model, ids, mask
