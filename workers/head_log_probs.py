"""Token log-probs and entropies of a Hugging Face causal LM, without its [tokens x vocabulary] logits.

During one forward the model's LM head is swapped (transformers' `set_output_embeddings`) for a
`LabelScoringHead` that holds the original head and the labels: where the model would compute logits, it
returns the log-probability of each label (and keeps the entropies), computed a chunk of tokens at a time
(`workers/rl_math/chunked_logits.py`). Running inside the model's own forward matters under FSDP2: the root
unit gathers the head's weight for that forward and sets it on the original head module, where the scoring
head reads it; the gradients go to that same weight (shared with the embedding when tied).

`logits_chunk_tokens` (`actor_rollout_ref.model.logits_chunk_tokens`) sets the chunk; 0 computes the full
logits as before. The full logits are also used for a head that is not a plain linear layer (a LoRA-adapted
head, or a head sharded as an FSDP unit of its own, whose weight is only gathered in its own forward).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from workers.rl_math.chunked_logits import chunked_log_probs_and_entropy
from workers.rl_math.logits import entropy_from_logits, log_probs_from_logits
from workers.rl_math.names import DEFAULT_LOGITS_CHUNK_TOKENS

_chunk_tokens: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()


def set_logits_chunk_tokens(model: nn.Module, tokens: int) -> None:
    """Tokens per chunk of the LM head's log-softmax for this model; 0: full logits."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"model.logits_chunk_tokens must be an int >= 0 (0: full logits), got {tokens!r}")
    _chunk_tokens[model] = tokens


def logits_chunk_tokens(model: nn.Module) -> int:
    return _chunk_tokens.get(model, DEFAULT_LOGITS_CHUNK_TOKENS)


class LabelScoringHead(nn.Module):
    """Stands in for a linear LM head: returns float32 log p(label) at each position it is given (instead of
    logits) and keeps the entropies in `entropy` (None without `with_entropy`)."""

    def __init__(
        self, head: nn.Linear, labels: torch.Tensor, temperature: float, chunk_tokens: int, with_entropy: bool
    ) -> None:
        super().__init__()
        self.head = head
        self.labels = labels
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens
        self.with_entropy = with_entropy
        self.log_probs: torch.Tensor | None = None
        self.entropy: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[:-1] != self.labels.shape:
            raise ValueError(
                f"the LM head got hidden states {tuple(hidden.shape)} for labels {tuple(self.labels.shape)}: "
                "logits_to_keep must select exactly the positions that predict the labels"
            )
        # head.weight is read here, inside the model's forward, where FSDP2 has set the gathered weight.
        head = self.head
        self.log_probs, self.entropy = chunked_log_probs_and_entropy(
            hidden, head.weight, head.bias, self.labels, self.temperature, self.chunk_tokens, self.with_entropy
        )
        return self.log_probs


def chunkable_head(model: nn.Module) -> nn.Linear | None:
    """The model's LM head when the chunked path can stand in for it, else None."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or isinstance(head, FSDPModule):
        return None
    return head


def token_log_probs_and_entropy(
    model: nn.Module,
    inputs: dict[str, Any],
    positions: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`model(**inputs)`'s log p(label) [b, K] float32 (float32 or the logits' dtype on the full-logits path)
    at the sequence `positions` [K] (the outputs there predict `labels` [b, K]) and the entropies [b, K] or
    None; entropy_grad=False: no graph is kept for the entropy."""
    chunk = logits_chunk_tokens(model)
    head = chunkable_head(model) if chunk > 0 else None
    if head is None:
        logits = model(**inputs, logits_to_keep=positions).logits / temperature
        log_probs = log_probs_from_logits(logits, labels)
        if not with_entropy:
            return log_probs, None
        return log_probs, entropy_from_logits(logits if entropy_grad else logits.detach())
    scorer = LabelScoringHead(head, labels, temperature, chunk, with_entropy)
    model.set_output_embeddings(scorer)  # the forward returns label log-probs as `logits`
    try:
        out = model(**inputs, logits_to_keep=positions)
    finally:
        model.set_output_embeddings(head)
    if out.logits is not scorer.log_probs:
        raise ValueError(
            f"{type(model).__name__} changes its LM head's output before returning it (e.g. logit soft-capping), "
            "so log-probs cannot be computed inside the head; set actor_rollout_ref.model.logits_chunk_tokens=0 "
            "(full logits)"
        )
    entropy = scorer.entropy
    if entropy is not None and not entropy_grad:
        entropy = entropy.detach()
    return scorer.log_probs, entropy
