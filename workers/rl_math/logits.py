"""Token entropy and label log-probabilities straight from logits."""

from __future__ import annotations

import torch

__all__ = ["entropy_from_logits", "log_probs_from_logits"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``[...]`` of ``softmax(logits)`` over the last dim of ``logits`` ``[..., vocab]``.

    Uses ``H = logsumexp(z) - sum_i softmax(z)_i z_i`` on max-shifted ``z``; it never takes the log
    of a (possibly underflowed) probability. Half-precision inputs are computed (and returned)
    in float32. ``-inf`` logits (banned tokens) contribute 0.
    """
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    # H is shift-invariant; shifting by the max avoids cancelling two huge numbers
    # (logsumexp(z) and E[z] are both ~max(z) for large logits).
    shifted = logits - logits.detach().amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted, dim=-1)
    # Replace -inf by the most negative finite number: p == 0 there, and 0 * -inf would be nan.
    finite = shifted.clamp(min=torch.finfo(shifted.dtype).min)
    return torch.logsumexp(shifted, dim=-1) - (probs * finite).sum(dim=-1)


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024
) -> torch.Tensor:
    """``log_softmax(logits)[..., label]`` ``[...]`` of ``logits`` ``[..., vocab]`` and token ids ``labels``
    ``[...]``, without materialising the full log-softmax.

    float32/float64: ``z[label] - logsumexp(z)`` (one gather, one reduction; no
    ``[..., vocab]`` log-probability tensor is kept for backward). Half precision (float32 result):
    log-softmax in float32 over ``chunk_size`` rows at a time, so the float32
    copy of the logits is bounded to ``chunk_size x vocab``.
    """
    if logits.dtype not in _LOW_PRECISION:
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1)
    pieces = []
    for start in range(0, flat_labels.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        logp = torch.log_softmax(flat_logits[rows].float(), dim=-1)
        pieces.append(logp.gather(-1, flat_labels[rows].unsqueeze(-1)).squeeze(-1))
    if not pieces:  # zero rows
        return torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    return torch.cat(pieces).reshape(labels.shape)
