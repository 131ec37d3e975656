"""Masked reductions over padded ``[batch, response_len]`` tensors.

A mask is 1 for real tokens and 0 for padding. Values stored at padding
positions never reach a result, even when they are ``nan``/``inf``: they are
selected away with ``torch.where`` instead of being multiplied by zero
(``nan * 0 == nan``).
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "last_valid_positions"]


def _weights(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mask as floating weights of ``x``'s shape (broadcast, so counts are right)."""
    return mask.to(x.dtype).expand_as(x)


def _select(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``x * weights`` with padding positions forced to an exact zero."""
    return torch.where(weights != 0, x, torch.zeros((), dtype=x.dtype, device=x.device)) * weights


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` (any shape, e.g. ``[batch, response_len]``) where ``mask`` (bool, int or float, broadcastable
    to ``x``) is non-zero: over ``dim`` only (``x.shape`` without it), or everything (``[]``) when ``dim`` is None."""
    kept = _select(x, _weights(x, mask))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over masked-in positions.

    Shapes as in :func:`masked_sum`. Where the mask selects nothing the mean is
    0 (not ``nan``), so an empty row cannot poison a batch statistic.
    """
    w = _weights(x, mask)
    total = masked_sum(x, w, dim)
    count = w.sum() if dim is None else w.sum(dim=dim)
    # Dividing by a "safe" count keeps both value and gradient finite when count == 0.
    safe_count = torch.where(count > 0, count, torch.ones_like(count))
    return torch.where(count > 0, total / safe_count, torch.zeros_like(total))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance ``[]`` of ``x`` over all masked-in positions (shapes as in :func:`masked_sum`).

    ``unbiased``: Bessel's correction ``n / (n - 1)``, ``n`` the masked-in positions; with ``n <= 1`` it is
    undefined and the (biased) value 0 is returned instead of ``inf``/``nan``.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = _weights(x, mask).sum()
        bessel = torch.where(n > 1, n / (n - 1).clamp(min=1e-12), torch.ones_like(n))
        var = var * bessel
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with ``mean``/``var`` (unbiased) over masked-in positions only (shapes as
    in :func:`masked_sum`); with ``shift_mean=False`` the mean is added back (only the scale changes).

    Returns ``x``'s shape. Padding positions are transformed like any other position (not zeroed); callers that
    need zeros there multiply by the mask.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def last_valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last non-zero of each row of a ``[batch, len]`` mask; -1 for rows without any.

    Not ``mask.sum() - 1``: a mask may have interior holes (tool tokens of a multi-turn response)."""
    real = mask.bool()
    positions = torch.arange(real.shape[1], device=real.device).expand_as(real)
    return torch.where(real, positions, torch.full_like(positions, -1)).max(dim=1).values
