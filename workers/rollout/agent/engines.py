"""Turn generators: one model turn for a list of conversations, on HF generate or vLLM.

`HFTurns` pads the contexts of a round into one `generate` call (turn-batched); under FSDP with several
ranks every rank must call it the same number of times, so it runs in lockstep and a rank without work
generates one token of a dummy row. `VLLMTurns` drives vLLM's engine step by step: a turn enters the
running batch as soon as its conversation is ready (continuous batching), no rounds, no lockstep.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workers.rollout.agent.loop import TurnOutput, TurnRequest
from workers.rollout.hf_generate import generate_token_lists
from workers.rollout.sampling import SamplingParams
from workers.rollout.vllm_requests import add_token_request, sampled_tokens, vllm_sampling
from workers.routing_replay.hooks import RouterChoices
from workers.routing_replay.rollout_tables import generation_rows


def turn_seed(call_seed: int, rank: int, row: int, turn: int) -> int:
    """Each (call, rank, row, turn) samples from its own seed, so rollouts are reproducible."""
    return (call_seed * 1_000_003 + rank * 65_537 + row * 257 + turn) % (2**31 - 1)


class HFTurns:
    lockstep = True

    def __init__(
        self,
        model: nn.Module,
        params: SamplingParams,
        device: torch.device,
        synced: bool,
        routing: RouterChoices | None = None,
    ) -> None:
        self.model, self.params, self.device, self.synced = model, params, device, synced
        self.routing = routing  # routing replay: the model's routers record each turn's experts

    def any_work(self, local: bool) -> bool:
        if not self.synced:
            return local
        flag = torch.tensor([int(local)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def generate(self, requests: list[TurnRequest]) -> list[TurnOutput]:
        if not requests and not self.synced:
            return []
        # A rank with nothing to do still takes part in the other ranks' generate (FSDP gathers).
        rows = requests or [TurnRequest(-1, 0, [self.params.pad_token_id], 1)]
        recording = self.routing.recording() if self.routing is not None else nullcontext()
        with recording:
            results = generate_token_lists(self.model, [r.context for r in rows], self.params, self.device,
                                           self.synced, limits=[r.max_tokens for r in rows])
        routed: list[torch.Tensor | None] = [None] * len(rows)
        if self.routing is not None:
            calls = self.routing.recorded_calls()
            routed = list(generation_rows(calls, [len(r.context) for r in rows], [len(t) for t, _ in results]))
        return [TurnOutput(t, lp, routed_experts=r) for (t, lp), r in zip(results, routed)] if requests else []


class VLLMTurns:
    """Continuous batching on vLLM's engine: every turn is its own request, added the moment its conversation
    is ready, and handed back at the engine step that finishes it; conversations join and leave the running
    batch independently (a `StreamingTurnGenerator`)."""

    def __init__(
        self,
        llm: Any,
        params: SamplingParams,
        call_seed: int | None,
        rank: int,
        lora_request: Any = None,
        returns_routing: bool = False,
    ) -> None:
        self.engine = llm.llm_engine
        self.params, self.call_seed, self.rank = params, call_seed, rank
        self.lora_request = lora_request  # the synced LoRA adapter every turn uses (None: the plain model)
        self.returns_routing = returns_routing  # the engine returns each request's experts (routing replay)
        self.submitted: dict[str, TurnRequest] = {}

    def submit(self, request: TurnRequest) -> None:
        seed = None if self.call_seed is None else turn_seed(self.call_seed, self.rank, request.row, request.turn)
        sampling = vllm_sampling(self.params, request.max_tokens, seed)
        # One output per turn, at its end.
        request_id = add_token_request(
            self.engine, f"agent-{self.rank}", request.context, sampling, self.lora_request, final_only=True
        )
        self.submitted[request_id] = request

    def step(self) -> list[tuple[TurnRequest, TurnOutput]]:
        finished = []
        for output in self.engine.step():
            if output.finished and output.request_id in self.submitted:
                routed = output.outputs[0].routed_experts if self.returns_routing else None
                turn = TurnOutput(*sampled_tokens(output), routed_experts=routed)
                finished.append((self.submitted.pop(output.request_id), turn))
        return finished

    def in_flight(self) -> int:
        return len(self.submitted)

    def cancel_all(self) -> None:
        if self.submitted:
            self.engine.abort_request(list(self.submitted))
            self.submitted.clear()
