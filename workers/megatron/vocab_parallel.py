"""Log-probs and entropy from logits split over the vocabulary across TP ranks (Megatron's output layer).

Each TP rank holds logits for its vocabulary slice. Sums over the vocabulary are all-reduced with
Megatron's `reduce_from_tensor_model_parallel_region` (identity backward: every TP rank computes the same
loss, so each rank's slice gets its own gradient). Entries past the HF vocabulary (Megatron pads it to a
multiple of 128 x TP) are masked out, so the results equal the HF model's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_MASKED = -1e30


def log_probs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [..., V/tp] (this rank's slice, already divided by the temperature), targets [...] ->
    log p(target) [...] float32, and the entropy [...] (None unless asked)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region as all_sum

    rank, size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
    group = ps.get_tensor_model_parallel_group()
    logits = logits.float()
    width = logits.shape[-1]
    start = rank * width
    vocab_ids = torch.arange(start, start + width, device=logits.device)
    # A large finite value, not -inf: exp() gives 0 and 0 * value stays 0 in the entropy sum.
    logits = logits.masked_fill(vocab_ids >= vocab_size, _MASKED)

    # A shift by the global max keeps exp() in range; it is a constant, so it carries no gradient.
    shift = logits.detach().max(dim=-1).values
    if size > 1:
        dist.all_reduce(shift, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - shift.unsqueeze(-1)
    exp = shifted.exp()
    sum_exp = exp.sum(dim=-1)
    local = (targets >= start) & (targets < start + width)
    picked = shifted.gather(-1, (targets - start).clamp(0, width - 1).unsqueeze(-1)).squeeze(-1) * local
    if size > 1:
        sum_exp, picked = all_sum(sum_exp), all_sum(picked)
    log_norm = sum_exp.log()
    log_probs = picked - log_norm
    if not with_entropy:
        return log_probs, None
    # H = log Z - E_p[logit]  (both in shifted terms)
    expected = (exp * shifted).sum(dim=-1)
    if size > 1:
        expected = all_sum(expected)
    entropy = log_norm - expected / sum_exp
    return log_probs, entropy
