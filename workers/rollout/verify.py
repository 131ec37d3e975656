"""Checking a weight sync: the engine must score a fixed probe batch as the trainer does.

After a sync the engine's log-probs of the probe (token t given tokens < t, temperature 1) are compared with
the trainer's own forward pass; a fingerprint of the engine's weights shows whether they changed at all.

The bound scales with how unlikely a probe token is: half-precision rounding moves a log-prob in proportion to
its distance from the rest of the distribution, so a token far in the tail of a sharpened policy (log-prob -40
where the uniform one is -log V) differs by proportionally more on a correct sync. A token at or above the
uniform log-prob gets the tolerance itself, a token at log-prob lp the tolerance x |lp| / log V.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

PROBE_ROWS, PROBE_LENGTH, PROBE_SEED = 4, 24, 20_261_123
# Largest allowed |engine - trainer| log-prob difference of a token at the uniform log-prob or likelier (see the
# module's note for less likely ones), by the engine's dtype (half precision rounds every matmul; fp32 differs
# only by kernel order).
# Measured on an H100 with a 494M Qwen2 in bf16: up to 0.10 (mean 0.03) for a correct sync; a lost or
# mis-mapped tensor moves log-probs by 1 or more.
DEFAULT_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.25, torch.float16: 0.1}
# A mixture of experts in half precision: the engine's fused-MoE kernels and the trainer's grouped experts round
# differently, and a token whose top-k choice is a near tie may go to another expert on one side, which moves that
# token alone by an expert's worth. Measured on an H200 with the tiny Qwen3-MoE in bf16: correct syncs up to 0.29
# (mean 0.007) near initialisation, and 1.07 at one token (scaled 0.97, mean 0.018) once the policy had collapsed.
# So a few tokens may exceed the bound (MOE_ROUTING_OUTLIERS of the probe's); a lost or mis-mapped weight moves
# every token routed through it.
MOE_HALF_PRECISION_TOLERANCE = 1.0
MOE_ROUTING_OUTLIERS = 0.05


@dataclass(frozen=True)
class SyncBound:
    """What a sync check allows: `tolerance` at the uniform log-prob (scaled below it), and the fraction of probe
    tokens that may exceed their bound (routing near-ties of a mixture of experts; 0 for a dense model)."""

    tolerance: float
    outlier_fraction: float = 0.0

    @staticmethod
    def of(dtype: torch.dtype, experts: bool = False, tolerance: float | None = None) -> SyncBound:
        """By the engine's dtype when `tolerance` (rollout.verify_tolerance) is None; a mixture of experts in half
        precision gets a looser bound and its routing outliers."""
        routed = experts and dtype != torch.float32
        default = MOE_HALF_PRECISION_TOLERANCE if routed else DEFAULT_TOLERANCE[dtype]
        return SyncBound(tolerance or default, MOE_ROUTING_OUTLIERS if routed else 0.0)


def probe_sequences(vocab_size: int, rows: int = PROBE_ROWS, length: int = PROBE_LENGTH) -> torch.Tensor:
    """The same token ids [rows, length] on every process (its own generator, fixed seed)."""
    generator = torch.Generator().manual_seed(PROBE_SEED)
    return torch.randint(0, vocab_size, (rows, length), generator=generator)


def trainer_log_probs(module: nn.Module, sequences: torch.Tensor, device: torch.device) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t >= 1 from the training model (an FSDP collective: all ranks run it)."""
    was_training = module.training
    module.eval()
    with torch.no_grad():
        ids = sequences.to(device)
        logits = module(input_ids=ids, use_cache=False).logits[:, :-1].float()
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    module.train(was_training)
    return log_probs.cpu()


@dataclass(frozen=True)
class SyncCheck:
    max_abs_diff: float
    mean_abs_diff: float
    bound: SyncBound
    # The worst token by its difference over its scale (max(1, |trainer log-prob| / log V)): that ratio, the
    # token's difference and the trainer's log-prob of it.
    scaled_max_diff: float
    worst_diff: float
    worst_log_prob: float
    uniform_log_prob: float
    tokens: int
    over_bound: int  # tokens whose difference exceeds their bound
    finite: bool  # no NaN or infinite difference: never a routing tie

    @property
    def allowed_over_bound(self) -> int:
        return int(self.bound.outlier_fraction * self.tokens)

    @property
    def ok(self) -> bool:
        return self.finite and self.over_bound <= self.allowed_over_bound

    def metrics(self, prefix: str = "rollout/sync") -> dict[str, float]:
        return {
            f"{prefix}_logprob_max_diff": self.max_abs_diff,
            f"{prefix}_logprob_mean_diff": self.mean_abs_diff,
            f"{prefix}_logprob_scaled_max_diff": self.scaled_max_diff,
            f"{prefix}_tokens_over_bound": float(self.over_bound),
        }


class WeightSyncMismatch(RuntimeError):
    """The rollout engine does not compute what the trainer computes after a weight sync."""


def compare_log_probs(trainer: torch.Tensor, engine: torch.Tensor, bound: SyncBound, vocab_size: int) -> SyncCheck:
    """Both sides' probe log-probs; each token's bound is the tolerance x max(1, |trainer log-prob| / log V)."""
    if trainer.shape != engine.shape:
        raise WeightSyncMismatch(
            f"probe log-prob shapes differ: trainer {tuple(trainer.shape)}, engine {tuple(engine.shape)}"
        )
    uniform = math.log(max(vocab_size, 2))
    diff = (trainer.float() - engine.float()).abs()
    scaled = diff / torch.clamp(trainer.float().abs() / uniform, min=1.0)
    worst = int(scaled.argmax())
    return SyncCheck(
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
        bound=bound,
        scaled_max_diff=float(scaled.flatten()[worst]),
        worst_diff=float(diff.flatten()[worst]),
        worst_log_prob=float(trainer.flatten()[worst]),
        uniform_log_prob=-uniform,
        tokens=diff.numel(),
        over_bound=int((~(scaled <= bound.tolerance)).sum()),  # a NaN counts as over
        finite=bool(torch.isfinite(diff).all()),
    )


def require_match(check: SyncCheck, where: str, setting: str = "rollout.verify_tolerance") -> None:
    """`setting` names where the user sets the tolerance."""
    if check.ok:
        return
    tolerance = check.bound.tolerance
    worst_bound = tolerance * max(1.0, abs(check.worst_log_prob) / abs(check.uniform_log_prob))
    allowed = ""
    if not check.finite:
        allowed = " (NaN or infinite differences included: never allowed)"
    elif check.bound.outlier_fraction:
        allowed = f" (at most {check.allowed_over_bound} may: routing near-ties of a mixture of experts)"
    raise WeightSyncMismatch(
        f"{where}: after the weight sync the rollout engine's log-probs of the probe batch differ from the "
        f"trainer's by up to {check.max_abs_diff:.3g} (mean {check.mean_abs_diff:.3g}); {check.over_bound} of "
        f"{check.tokens} tokens exceed their bound{allowed}; the worst, which the trainer scores at log-prob "
        f"{check.worst_log_prob:.3g}, differs by {check.worst_diff:.3g}, above its bound {worst_bound:.3g} (the "
        f"tolerance {tolerance:g}, scaled by how far the token lies below the uniform log-prob "
        f"{check.uniform_log_prob:.3g}). Weights were lost or mis-mapped on the way (names, dtype, tied "
        f"embeddings); {setting} sets the bound"
    )


# Key under which a sender returns the `WeightFingerprint` of what it sent (taken out of the sync metrics).
TRAINER_FINGERPRINT = "sync/trainer_fingerprint"


# Elements summed at once: a float64 sum casts its whole input first, so one call over the engine's embedding
# (7B: 545 M bf16 values) made 5.4 GiB of temporaries on a GPU whose engine was awake (the 7B LoRA step's
# generate peak 80.4 GiB, 5.7 over the step before, whose sync had no change check). A chunk's are 160 MB.
FINGERPRINT_CHUNK_ELEMENTS = 1 << 24


class WeightFingerprint:
    """Sum of |w| (in float64) over tensors, the same measure `sc_weights_fingerprint` takes of the engine.
    The trainer feeds it the tensors exactly as sent (cast to the engine's dtype), so a change too small to
    survive that cast, or no change at all, is not counted as a change. Summed on each tensor's device, a
    chunk at a time (bounded temporaries), and read back once (one read per tensor, at 30B-A3B's tens of
    thousands of expert factors, took seconds)."""

    def __init__(self, chunk_elements: int = FINGERPRINT_CHUNK_ELEMENTS) -> None:
        self._totals: dict[torch.device, torch.Tensor] = {}
        self.chunk_elements = chunk_elements

    def add(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            whole = tensor.detach()
            # Split only what is large (30B-A3B sends tens of thousands of small expert factors).
            chunks = (whole,) if whole.numel() <= self.chunk_elements else whole.reshape(-1).split(self.chunk_elements)
            for chunk in chunks:
                part = torch.sum(chunk.abs(), dtype=torch.float64)
                total = self._totals.get(part.device)
                self._totals[part.device] = part if total is None else total + part

    @property
    def value(self) -> float:
        return sum(float(total.item()) for total in self._totals.values())


def fingerprinted(
    pairs: Iterable[tuple[str, torch.Tensor]], fingerprint: WeightFingerprint
) -> Iterator[tuple[str, torch.Tensor]]:
    """`pairs` unchanged, each tensor added to `fingerprint` on the way."""
    for name, tensor in pairs:
        fingerprint.add([tensor])
        yield name, tensor


def require_changed(
    engine_before: float, engine_after: float, trainer_before: float, trainer_after: float, where: str
) -> None:
    """The engine's weights change in a sync exactly when the trainer's (in the engine's dtype) changed
    since the previous one: changed there and not here means the sync loaded nothing; unchanged there and
    changed here means the engine loaded something else. A step may leave the weights as they were (zero
    gradient, e.g. all advantages 0, or an update below the engine dtype's resolution)."""
    trainer_changed, engine_changed = trainer_before != trainer_after, engine_before != engine_after
    if trainer_changed and not engine_changed:
        raise WeightSyncMismatch(
            f"{where}: the trainer's weights changed since the last sync (fingerprint {trainer_before!r} -> "
            f"{trainer_after!r}) but the rollout engine's weights did not ({engine_after!r} before and after); "
            "the sync loaded nothing"
        )
    if engine_changed and not trainer_changed:
        raise WeightSyncMismatch(
            f"{where}: the trainer's weights did not change since the last sync (fingerprint {trainer_after!r}) "
            f"but the rollout engine's did ({engine_before!r} -> {engine_after!r}); the sync loaded something "
            "other than the trainer's weights"
        )


def verify_engines(
    train: Any, infer: Any, vocab_size: int, dtype: torch.dtype, tolerance: float | None, where: str,
    experts: bool = False,
) -> dict[str, float]:
    """Every engine's probe log-probs (worker group `infer`) against the trainer's (worker group `train`, rank 0's);
    `where` names the sync in errors, `experts` says the model is a mixture of experts (`SyncBound.of`).
    Returns the worst engine's difference as metrics."""
    trainer, engines = train.probe_log_probs()[0], infer.probe_log_probs(vocab_size)
    bound = SyncBound.of(dtype, experts, tolerance)
    checks = [compare_log_probs(trainer, log_probs, bound, vocab_size) for log_probs in engines]
    for engine, check in enumerate(checks):
        require_match(check, f"{where} to engine {engine}")
    return max(checks, key=lambda check: check.scaled_max_diff).metrics()
