"""What a trained model's forwards do with the routing, pass by pass (`actor.router_replay.mode`, verl's names):

| mode | rollout | log-prob pass (pi_old) | update |
| --- | --- | --- | --- |
| `disabled`, `rollout.enable_rollout_routing_replay=true` | records | compares (metric only) | live |
| `R2` | - | records its own | replays the log-prob pass's |
| `R3` (with `rollout.enable_rollout_routing_replay=true`) | records | replays the rollout's | replays the rollout's |

The reference policy always routes live. Every comparison and replay counts how often the trainer's own choice
differed from the recorded one (`router_replay/mismatch_log_prob`, `router_replay/mismatch_update`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Literal

import torch
from torch import nn

from protocol import DataProto
from workers.routing_replay.hooks import RouterChoices
from workers.routing_replay.token_order import ROUTED_EXPERTS, TokenOrder

PassMode = Literal["record", "replay", "compare"]


def routing_wanted(config: dict[str, Any]) -> bool:
    """Whether the actor's routers need hooks (a worker config with `actor` and `rollout` sections)."""
    replays = config["actor"]["router_replay"]["mode"] != "disabled"
    return replays or bool(config["rollout"]["enable_rollout_routing_replay"])


def log_prob_pass_mode(config: dict[str, Any]) -> PassMode | None:
    mode = config["actor"]["router_replay"]["mode"]
    if mode == "R2":
        return "record"
    if mode == "R3":
        return "replay"
    return "compare" if config["rollout"]["enable_rollout_routing_replay"] else None


def update_pass_mode(config: dict[str, Any], data: DataProto) -> PassMode | None:
    """R2 without a log-prob pass (the update's own forward gives pi_old) has nothing recorded: live routing."""
    mode = config["actor"]["router_replay"]["mode"]
    if mode == "R3" or (mode == "R2" and ROUTED_EXPERTS in data.batch.keys()):
        return "replay"
    return None


class PassRouting:
    """The mode of the pass running on a trained model's routers (None: live routing), whatever model holds them
    (Hugging Face: `ModelRouting`; megatron-core: workers/megatron/router_replay.py)."""

    def __init__(self) -> None:
        self.mode: PassMode | None = None

    @contextmanager
    def pass_mode(self, mode: PassMode | None, data: DataProto, method: str) -> Iterator[None]:
        if mode in ("replay", "compare") and ROUTED_EXPERTS not in data.batch.keys():
            raise ValueError(
                f"{method}: routing replay wants the rollout's expert choices ({ROUTED_EXPERTS!r}) in the batch, and "
                "it has none: set rollout.enable_rollout_routing_replay=true (vLLM on a GPU or HF generate "
                "records them, single-turn or in the agent loop), or actor.router_replay.mode=R2 (the log-prob pass "
                "records them)"
            )
        self.mode = mode
        try:
            yield
        finally:
            self.mode = None

    def mismatch_share(self) -> float | None:
        """The share of compared token-layer routings whose live choice differed since the last call (None: none
        compared); a collective where the model's layers or tokens are split over ranks."""
        raise NotImplementedError

    def pop_mismatch(self, metric: str) -> dict[str, float]:
        share = self.mismatch_share()
        return {} if share is None else {f"router_replay/mismatch_{metric}": share}


class ModelRouting(PassRouting):
    """A trained Hugging Face model's `RouterChoices`."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.model = model
        self.device = device
        self.choices = RouterChoices(model)

    def mismatch_share(self) -> float | None:
        return self.choices.pop_mismatch()

    @contextmanager
    def micro_batch(self, micro: DataProto) -> Iterator[list[torch.Tensor]]:
        """Around one micro-batch's forward; in a recording pass the list gets its routing [b, S, layers, k]."""
        recorded: list[torch.Tensor] = []
        if self.mode is None:
            yield recorded
            return
        order = TokenOrder.of(self.model, micro.batch["attention_mask"])
        if self.mode == "record":
            with self.choices.recording():
                yield recorded
            calls = self.choices.recorded_calls()
            if len(calls) != 1:
                raise RuntimeError(f"routing replay: one forward routed its tokens {len(calls)} times, expected once")
            recorded.append(order.to_positions(calls[0]).cpu())
            return
        # On the model's device once per micro-batch: each router then reads its layer's column without a copy.
        table = order.to_forward(micro.batch[ROUTED_EXPERTS].to(self.device))
        context = self.choices.replaying(table) if self.mode == "replay" else self.choices.comparing(table)
        with context:
            yield recorded


def routing_context(routing: ModelRouting | None, micro: DataProto):  # noqa: ANN201 - a context manager
    """`routing.micro_batch(micro)`, or a context yielding an empty list when the model has no routing hooks."""
    return routing.micro_batch(micro) if routing is not None else nullcontext([])


@contextmanager
def routing_pass(
    routing: PassRouting | None, mode: PassMode | None, data: DataProto, method: str, metrics: dict[str, float],
    metric: str,
) -> Iterator[None]:
    """One pass of `method` over `data` in `mode` on a model with routing hooks (none: live routing); the share of
    routings that differed from the recorded ones goes to `metrics`."""
    if routing is None or mode is None:
        yield
        return
    with routing.pass_mode(mode, data, method):
        yield
    metrics.update(routing.pop_mismatch(metric))
