"""`TrainBackend`: what the training logic asks of a sharded model, whatever shards it (FSDP2, megatron-core).

A backend runs micro-batches: it computes the response tokens' log-probs (and entropies) or values its own way
(FSDP: the HF model's packed forward and chunked head; Megatron: its pipeline schedule and vocab-parallel
head) and hands them to a loss function written once (workers/training/). The backend also owns the
optimizer step, the LR schedule, checkpoints and the HF export.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
import torch.distributed as dist

from protocol import DataProto
from workers.training.micro_batching import MicroBatching

if TYPE_CHECKING:
    from workers.routing_replay.passes import PassRouting


@dataclass(frozen=True)
class ResponseForward:
    """What a forward pass hands to the loss: the response tokens' log-probs (and entropies), values (a value
    head: the state before each token) or scores (FSDP's reward model: its head at each token)."""

    kind: Literal["log_probs", "values", "scores"]
    temperature: float = 1.0
    with_entropy: bool = False
    entropy_grad: bool = True  # False: the entropy is only reported, no graph is kept for it


@dataclass(frozen=True)
class ResponseOutputs:
    """One micro-batch's forward, aligned to its response tokens: [b, R] tensors on the backend's device."""

    device: torch.device
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    values: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    router_loss: torch.Tensor | None = None  # a mixture of experts' load-balancing loss (actor.router_aux_loss_coef)
    routed_experts: torch.Tensor | None = None  # [b, S, layers, k] the experts a recording pass chose (routing replay)


# (a micro-batch's outputs, the micro-batch) -> (scalar loss, what to keep of it: float metrics or tensors)
MicroLoss = Callable[[ResponseOutputs, DataProto], tuple[torch.Tensor, dict[str, Any]]]
# (a micro-batch's outputs, the micro-batch) -> per-row tensors to return (forward-only passes)
MicroKeep = Callable[[ResponseOutputs, DataProto], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class DataParallel:
    """The ranks a gradient is averaged over. `group` holds every rank whose rows count toward a mini-batch's
    loss units (None: all ranks); `copies` of them hold each row (Ulysses: the k ranks sharing a sequence)."""

    size: int
    group: dist.ProcessGroup | None = None
    copies: int = 1

    def totals(self, values: Sequence[float], device: torch.device) -> list[float]:
        """Each of `values` summed over the data-parallel ranks, each row counted once (one all-reduce)."""
        summed = torch.tensor(list(values), dtype=torch.float64, device=device)
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(summed, group=self.group)
        return (summed / self.copies).tolist()

    def total(self, value: float, device: torch.device) -> float:
        return self.totals([value], device)[0]


@dataclass
class MicroResults:
    """What `forward_backward` kept per micro-batch (on the ranks that report outputs), and the allocator's
    block releases it made between micro-batches (trainer.release_cached_blocks)."""

    kept: list[dict[str, Any]] = field(default_factory=list)
    cached_block_releases: int = 0


def require_trainable(optimizer: object | None, what: str) -> None:
    """A backend built frozen (no optimizer) refuses `what`, a training call."""
    if optimizer is None:
        raise RuntimeError(f"{what} needs a trainable model; this model was built frozen (no optimizer)")


class TrainBackend(Protocol):
    """Implemented by `FSDPBackend` and `MegatronBackend`; built after the process group exists."""

    device: torch.device
    dtype: torch.dtype
    model_path: str
    routing: PassRouting | None  # routing replay on a mixture of experts' routers, or None

    def data_parallel(self) -> DataParallel:
        """The data-parallel ranks of this model's gradient average."""
        ...

    def reports_outputs(self) -> bool:
        """Whether this rank holds the outputs (Megatron: the last pipeline stage; FSDP: every rank)."""
        ...

    def micro_batches(self, data: DataProto, batching: MicroBatching) -> tuple[list[DataProto], list[int]]:
        """`data` split for one pass, and the row order the micro-batches follow (collective for a token budget)."""
        ...

    def forward_backward(self, micros: list[DataProto], forward: ResponseForward, loss_fn: MicroLoss) -> MicroResults:
        """Forward every micro-batch, backward `loss_fn`'s loss (gradients accumulate; the caller weights)."""
        ...

    def forward_only(
        self, micros: list[DataProto], forward: ResponseForward, keep: MicroKeep
    ) -> list[dict[str, torch.Tensor]]:
        """No-grad forward of every micro-batch; what `keep` returned per micro-batch ([] on non-reporting ranks)."""
        ...

    def zero_grad(self) -> None: ...

    def optimizer_step(self, grad_clip: float) -> float:
        """Clip and step; returns the global gradient norm (a non-finite norm skips the step on every rank)."""
        ...

    def current_lr(self) -> float: ...

    def lr_scheduler_step(self) -> None: ...

    def save_checkpoint(self, path: str, extra: dict[str, Any] | None = None) -> None: ...

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore what `save_checkpoint` wrote; returns the caller's `extra` entries."""
        ...

    def export_hf(self, path: str) -> None:
        """Write the model as an HF folder (a collective; one rank writes)."""
        ...
