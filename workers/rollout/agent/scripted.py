"""`ScriptedTurns`: a policy whose turns are written by a function, for tests and loop-overhead benchmarks.

With an `inner` generator the real engine still generates every turn (so its cost is measured) and the
script then replaces the text: random weights never call tools, a script can force them to.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from workers.rollout.agent.loop import TurnGenerator, TurnOutput, TurnRequest


class ScriptedTurns:
    def __init__(
        self, tokenizer: Any, eos_token_id: int, script: Callable[[TurnRequest], str], inner: TurnGenerator | None = None
    ) -> None:
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
        outputs = []
        for request in requests:
            tokens = list(self.tokenizer(self.script(request), add_special_tokens=False)["input_ids"]) + [self.eos_token_id]
            tokens = tokens[: request.max_tokens]
            outputs.append(TurnOutput(tokens, [-0.5] * len(tokens)))
        return outputs
