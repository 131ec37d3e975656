"""Label log-probabilities and entropies straight from hidden states, a chunk of tokens at a time.

`log_probs_from_logits` / `entropy_from_logits` need the logits of every token: N x V float32 values (152064
entries per token for Qwen2.5; 32k response tokens make 18 GiB, kept for backward). Here the output projection,
the log-softmax and the entropy run over `chunk_tokens` tokens at a time, forward and backward: only the hidden
states and the head's weight are kept for backward (the logits of a chunk are computed again there), so the
float32 logits alive at any moment are those of one chunk.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["chunked_log_probs_and_entropy"]


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """float32 logits [c, V] / temperature of one chunk, in a buffer of their own (free to overwrite). The
    product runs in the compute dtype, as the head's nn.Linear does."""
    logits = hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)
    if logits.dtype != torch.float32:
        logits = logits.float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def _finite(values: torch.Tensor) -> torch.Tensor:
    """In place: -inf (a banned token) becomes the most negative finite number, so that 0 * value is 0."""
    return values.clamp_(min=torch.finfo(values.dtype).min)


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        chunk_tokens: int,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # hidden [N, H], labels [...] with N entries; the outputs take the labels' shape (not views of flat
        # tensors: FSDP warns when a forward returns a view).
        count = hidden.shape[0]
        log_probs_out = torch.empty(labels.shape, dtype=torch.float32, device=hidden.device)
        entropy_out = torch.empty(labels.shape if with_entropy else (0,), dtype=torch.float32, device=hidden.device)
        log_probs, entropy, flat_labels = log_probs_out.view(-1), entropy_out.view(-1), labels.reshape(-1)
        for start in range(0, count, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            # One call per chunk: its [c, V] buffers are freed before the next chunk's are allocated.
            chunk_log_probs, chunk_entropy = _chunk_scores(
                hidden[rows], weight, bias, flat_labels[rows], temperature, with_entropy
            )
            log_probs[rows] = chunk_log_probs
            if with_entropy:
                entropy[rows] = chunk_entropy
        ctx.save_for_backward(hidden, weight, bias, labels, entropy_out)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        ctx.set_materialize_grads(False)  # an unused output (the entropy without a bonus) gets None: no work for it
        return log_probs_out, entropy_out

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:
        hidden, weight, bias, labels, entropy = ctx.saved_tensors
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        grad_weight = torch.zeros_like(weight) if wants_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if wants_bias else None
        if grad_log_probs is None and grad_entropy is None:
            return grad_hidden, grad_weight, grad_bias, None, None, None, None
        labels = labels.reshape(-1)
        grad_log_probs = None if grad_log_probs is None else grad_log_probs.reshape(-1)
        grad_entropy = None if grad_entropy is None else grad_entropy.reshape(-1)
        entropy = entropy.reshape(-1)
        for start in range(0, hidden.shape[0], ctx.chunk_tokens):
            rows = slice(start, start + ctx.chunk_tokens)
            grad_logits = _logits_gradient(
                hidden[rows], weight, bias, labels[rows], ctx.temperature,
                None if grad_log_probs is None else grad_log_probs[rows],
                None if grad_entropy is None else (grad_entropy[rows], entropy[rows]),
            )
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0, dtype=torch.float32)
            grad_logits = grad_logits.to(hidden.dtype)
            if grad_hidden is not None:
                torch.mm(grad_logits, weight, out=grad_hidden[rows])
            if grad_weight is not None:
                # Accumulated in the weight's dtype (one rounding per chunk in half precision).
                grad_weight.addmm_(grad_logits.T, hidden[rows])
            del grad_logits  # before the next chunk's logits exist
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def _chunk_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(label) [c] and the entropy [c] (or None) of one chunk, float32."""
    # Shifted by the row max (H is shift-invariant; exp stays in range), as entropy_from_logits does.
    shifted = _chunk_logits(hidden, weight, bias, temperature)
    shifted.sub_(shifted.amax(dim=-1, keepdim=True))
    picked = shifted.gather(-1, labels[:, None]).squeeze(-1)
    if not with_entropy:
        return picked - shifted.exp_().sum(dim=-1).log_(), None
    exp = shifted.exp()
    sum_exp = exp.sum(dim=-1)
    log_norm = sum_exp.log()
    # H = log Z - E_p[z]
    expected = exp.mul_(_finite(shifted)).sum(dim=-1).div_(sum_exp)
    return picked - log_norm, log_norm - expected


def _logits_gradient(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float,
    grad_log_probs: torch.Tensor | None,
    entropy_part: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """d loss / d (raw logits) [c, V] float32 of one chunk, from the gradients of its log-probs and entropies.

    With z = logits / T, p = softmax(z): d log p_y / dz = onehot_y - p, and d H / dz = -p * (log p + H).
    """
    shifted = _chunk_logits(hidden, weight, bias, temperature)
    shifted.sub_(shifted.amax(dim=-1, keepdim=True))
    if entropy_part is None:
        probs = shifted.exp_()
        grad = probs.div_(probs.sum(dim=-1, keepdim=True)).mul_(-grad_log_probs[:, None])
    else:
        grad_entropy, entropy = entropy_part
        probs = shifted.exp()
        sum_exp = probs.sum(dim=-1, keepdim=True)
        probs.div_(sum_exp)
        log_p = shifted.sub_(sum_exp.log_())
        # p * (log p + H): finite where p == 0 once -inf is clamped.
        grad = _finite(log_p).add_(entropy[:, None]).mul_(probs).mul_(-grad_entropy[:, None])
        if grad_log_probs is not None:
            grad.sub_(probs.mul_(grad_log_probs[:, None]))
        del probs
    if grad_log_probs is not None:
        grad.scatter_add_(-1, labels[:, None], grad_log_probs[:, None].float())
    return grad.div_(temperature) if temperature != 1.0 else grad


def chunked_log_probs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = 2048,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log_softmax((hidden @ weight.T + bias) / temperature)[label] and the entropy of that distribution.

    The same values as `log_probs_from_logits` and `entropy_from_logits` on the full logits (float32 math;
    `-inf` logits count as probability 0), and the same gradients to `hidden`, `weight` and `bias`; the
    float32 logits of at most `chunk_tokens` tokens exist at a time. Gradients flow to the entropy only when
    the caller uses it (detach it to report it only).

    ``hidden`` ``[..., H]``: the hidden states whose next tokens ``labels`` ``[...]`` are scored (the compute
    dtype); ``weight`` ``[V, H]``: the LM head's; ``bias`` ``[V]`` or None. Returns ``[...]`` float32 log-probs
    and ``[...]`` float32 entropies (None unless `with_entropy`).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} must agree on every dim but the last"
        )
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    log_probs, entropy = _ChunkedLogProbs.apply(
        flat_hidden, weight, bias, labels, float(temperature), int(chunk_tokens), with_entropy
    )
    return log_probs, entropy if with_entropy else None
