"""Record, compare and replay the expert choices of a Hugging Face mixture of experts' routers.

Routing replay (`actor.router_replay.mode`, verl's R2 / R3) keeps the experts each token was routed to in one
forward (the rollout engine's, or the trainer's log-prob pass) and makes later training forwards use the same
ones: a near tie between two experts' router logits, broken one way by the engine's kernels and the other by the
trainer's, otherwise moves a token's log-prob far more than the weights' rounding does. Only the choice is
replayed: the chosen experts' weights are recomputed from the live router logits, so the router still gets a
gradient.

A forward hook on each router module (the class the model declares for its `router_logits`, as the load-balancing
loss finds it: workers/moe_router_loss.py) sees `(logits, weights, expert indices)` for the tokens of one
forward, in the forward's token order; `workers/routing_replay/token_order.py` maps the batch's per-position
table to that order and back.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from workers.moe_router_loss import router_source

NOT_RECORDED = -1  # a position whose experts the live router picks (padding, a response's last token)
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class Mismatch:
    """Token-layer routings compared with a recorded choice, and how many chose another expert set."""

    compared: torch.Tensor
    differ: torch.Tensor

    @classmethod
    def zero(cls) -> "Mismatch":
        return cls(torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long))

    def count(self, recorded: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        """Counts the tokens of `recorded` [tokens, k] (long, `NOT_RECORDED` rows: none recorded) whose `live`
        expert set differs; returns the experts to replay: the recorded ones where there are, else the live ones."""
        kept = recorded[:, 0] != NOT_RECORDED
        live = live.long()
        differ = (recorded.sort(dim=-1).values != live.sort(dim=-1).values).any(dim=-1) & kept
        self.compared = self.compared + kept.sum()
        self.differ = self.differ + differ.sum()
        return torch.where(kept[:, None], recorded, live)

    def share(self) -> float | None:
        compared = int(self.compared)
        return None if compared == 0 else int(self.differ) / compared


class RouterChoices:
    """Hooks on every router of `model`. Outside a context the routers run as they are. `recording()` keeps each
    layer's chosen experts; `replaying(table)` makes each router choose `table[:, layer]` ([tokens, layers, k]
    long, `NOT_RECORDED` rows keep the live choice) and counts how often the live choice differed;
    `comparing(table)` only counts."""

    def __init__(self, model: nn.Module) -> None:
        source = router_source(model)
        if source is None:
            raise ValueError(
                f"routing replay (actor.router_replay.mode / rollout.enable_rollout_routing_replay) is set, but "
                f"{type(model).__name__} declares no mixture-of-experts router (a dense model); set "
                "actor.router_replay.mode=disabled and rollout.enable_rollout_routing_replay=false"
            )
        router_class, self._logits_index = source
        self.layers: list[int] = []
        for name, module in model.named_modules():
            if not isinstance(module, router_class):
                continue
            found = _LAYER_INDEX.search(name)
            if found is None:
                raise ValueError(f"routing replay: cannot tell which decoder layer the router {name!r} belongs to")
            layer = int(found.group(1))
            self.layers.append(layer)
            module.register_forward_hook(self._hook_for(layer))
        self.num_layers = max(self.layers) + 1
        self._mode: str | None = None
        self._table: torch.Tensor | None = None
        self._recorded: dict[int, list[torch.Tensor]] = {}
        self._renormalised: dict[type, bool] = {}
        self.mismatch = Mismatch.zero()

    # ---- contexts -------------------------------------------------------------------------------------
    @contextmanager
    def recording(self) -> Iterator[None]:
        """Keep each router's chosen experts (every call: a generation's prefill, then one call per token)."""
        self._recorded = {layer: [] for layer in self.layers}
        with self._mode_set("record"):
            yield

    @contextmanager
    def replaying(self, table: torch.Tensor) -> Iterator[None]:
        with self._mode_set("replay", table):
            yield

    @contextmanager
    def comparing(self, table: torch.Tensor) -> Iterator[None]:
        with self._mode_set("compare", table):
            yield

    @contextmanager
    def _mode_set(self, mode: str, table: torch.Tensor | None = None) -> Iterator[None]:
        self._mode, self._table = mode, table
        try:
            yield
        finally:
            self._mode, self._table = None, None

    def recorded_calls(self) -> list[torch.Tensor]:
        """Per router call of the last `recording()`: the experts [tokens, layers, k] (long, `NOT_RECORDED` at
        a layer without a router)."""
        calls = [self._recorded[layer] for layer in self.layers]
        if not calls or not calls[0]:
            return []
        out = []
        for index, first in enumerate(calls[0]):
            table = first.new_full((first.shape[0], self.num_layers, first.shape[1]), NOT_RECORDED)
            for layer, layer_calls in zip(self.layers, calls):
                table[:, layer] = layer_calls[index]
            out.append(table)
        return out

    def pop_mismatch(self) -> float | None:
        """The share of compared token-layer routings whose live choice differed, since the last call."""
        mismatch, self.mismatch = self.mismatch, Mismatch.zero()
        return mismatch.share()

    # ---- the hook -------------------------------------------------------------------------------------
    def _hook_for(self, layer: int):  # noqa: ANN202 - a forward hook
        def hook(module: nn.Module, inputs: tuple, output: object) -> object:
            if self._mode is None:
                return None
            if not isinstance(output, tuple) or len(output) != 3:
                raise ValueError(
                    f"routing replay needs a router returning (logits, weights, expert indices); "
                    f"{type(module).__name__} returned {type(output).__name__}"
                )
            logits, weights, live = output
            if self._mode == "record":
                self._recorded[layer].append(live.detach().long())
                return None
            chosen = self.mismatch.count(self._replayed(layer, live), live)
            if self._mode == "compare":
                return None
            new_weights = self._weights(module, logits, weights, live, chosen)
            return logits, new_weights, chosen.to(live.dtype)

        return hook

    def _replayed(self, layer: int, live: torch.Tensor) -> torch.Tensor:
        table = self._table
        assert table is not None
        if table.shape[0] != live.shape[0] or layer >= table.shape[1] or table.shape[2] != live.shape[1]:
            raise RuntimeError(
                f"routing replay: the router of layer {layer} chose {tuple(live.shape)} (tokens, experts per token) "
                f"but the recorded routing for this forward is {tuple(table.shape)} (tokens, layers, experts per "
                "token): the recorded routing does not belong to these tokens"
            )
        return table[:, layer].to(live.device)  # no copy where the table is on the router's device already

    def _weights(
        self, module: nn.Module, logits: torch.Tensor, weights: torch.Tensor, live: torch.Tensor, chosen: torch.Tensor
    ) -> torch.Tensor:
        """The chosen experts' weights from the live logits, by the rule this router uses: a softmax over every
        expert read at the chosen ones, renormalised over them or not (checked against the router's own output
        at its own choice, once per router class)."""
        probs = torch.softmax(logits.float(), dim=-1)
        router_class = type(module)
        if router_class not in self._renormalised:
            # Outside autograd: a checkpointed layer's recompute skips this check, and must save the same tensors.
            with torch.no_grad():
                self._renormalised[router_class] = _weight_rule(router_class, probs, weights, live)
        picked = probs.gather(-1, chosen)
        if self._renormalised[router_class]:
            picked = picked / picked.sum(dim=-1, keepdim=True)
        return picked.to(weights.dtype)


def _weight_rule(router_class: type, probs: torch.Tensor, weights: torch.Tensor, live: torch.Tensor) -> bool:
    """Whether the router renormalises its softmax over the chosen experts (True) or not (False)."""
    raw = probs.gather(-1, live.long())
    tolerance = dict(atol=1e-2, rtol=1e-2) if weights.dtype in (torch.bfloat16, torch.float16) else dict(atol=1e-5)
    for renormalised, candidate in ((True, raw / raw.sum(dim=-1, keepdim=True)), (False, raw)):
        if torch.allclose(candidate, weights.float(), **tolerance):
            return renormalised
    raise ValueError(
        f"routing replay: {router_class.__name__} weighs its experts by a rule other than a softmax over the "
        "experts' logits (renormalised over the chosen ones or not), so its choice cannot be replayed here; "
        "set actor.router_replay.mode=disabled"
    )
