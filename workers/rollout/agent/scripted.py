"""Scripted policies: turns written by a function, for tests and loop-overhead benchmarks.

With an `inner` engine the real engine still generates every turn (so its cost is measured) and the script
then replaces the text: random weights never call tools, a script can force them to. `ScriptedTurns` works
in rounds (over HF generate, or alone); `ScriptedStream` over a continuously batching engine (vLLM).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workers.rollout.agent.loop import StreamingTurnGenerator, TurnGenerator, TurnOutput, TurnRequest

Script = Callable[[TurnRequest], str]


def scripted_turn(tokenizer: Any, eos_token_id: int, script: Script, request: TurnRequest) -> TurnOutput:
    tokens = list(tokenizer(script(request), add_special_tokens=False)["input_ids"]) + [eos_token_id]
    tokens = tokens[: request.max_tokens]
    return TurnOutput(tokens, [-0.5] * len(tokens))


class ScriptedTurns:
    def __init__(self, tokenizer: Any, eos_token_id: int, script: Script, inner: TurnGenerator | None = None) -> None:
        self.tokenizer, self.eos_token_id, self.script, self.inner = tokenizer, eos_token_id, script, inner
        self.lockstep = inner.lockstep if inner is not None else False
        self.rounds: list[tuple[float, list[TurnRequest]]] = []  # (start time, requests) of every round
        self.engine_s = 0.0

    def any_work(self, local: bool) -> bool:
        return self.inner.any_work(local) if self.inner is not None else local

    def generate(self, requests: list[TurnRequest]) -> list[TurnOutput]:
        self.rounds.append((time.perf_counter(), list(requests)))
        if self.inner is not None:
            start = time.perf_counter()
            self.inner.generate(requests)
            self.engine_s += time.perf_counter() - start
        return [scripted_turn(self.tokenizer, self.eos_token_id, self.script, r) for r in requests]


class ScriptedStream:
    def __init__(self, tokenizer: Any, eos_token_id: int, script: Script, inner: StreamingTurnGenerator) -> None:
        self.tokenizer, self.eos_token_id, self.script, self.inner = tokenizer, eos_token_id, script, inner
        # (time, request, turns already in the engine) of every submission: > 0 means it joined a running batch
        self.submissions: list[tuple[float, TurnRequest, int]] = []
        self.steps = 0
        self.engine_s = 0.0

    def submit(self, request: TurnRequest) -> None:
        self.submissions.append((time.perf_counter(), request, self.inner.in_flight()))
        start = time.perf_counter()
        self.inner.submit(request)
        self.engine_s += time.perf_counter() - start

    def step(self) -> list[tuple[TurnRequest, TurnOutput]]:
        start = time.perf_counter()
        finished = self.inner.step()
        self.engine_s += time.perf_counter() - start
        self.steps += 1
        return [(r, scripted_turn(self.tokenizer, self.eos_token_id, self.script, r)) for r, _ in finished]

    def in_flight(self) -> int:
        return self.inner.in_flight()

    def cancel_all(self) -> None:
        self.inner.cancel_all()
