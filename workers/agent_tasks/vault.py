"""synthetic/tool_vault: a code only the tool knows, learnable by the random tiny model on CPU.

Each conversation gets a fresh secret code, one character of `CODE_CHARS`, drawn from the rollout's seed;
the prompt says nothing about it, so the answer is reachable only through the tool. In the `tiny` call
format a turn containing `!` calls the `vault` tool, which answers with the code written `CODE_REPEAT`
times; the model's next turn must start with it. The task config (trainer/config/task/tool_vault.yaml)
gives each model turn one token: `!`, then the code.

What made it learnable in minutes (measured, docs/agents.md): one-token turns (longer turns add sampled
filler tokens that share the answer's advantage and drown its gradient: with 4-token turns the copy was
not learned in 120 steps), and many copies of the code in the tool message (the 2-layer model can then
copy it by attending anywhere in the message).

Reward (documented shaping), only after at least one call (an answer without a call scores 0 even when
it guesses right): 0.2 for the call, plus 0.8 when the final answer starts with the code, or 0.1 when it
starts with another code character (a well-formed but wrong answer); 1.0 at most, and above 0.3 only with
the right code. A random model calls the tool in a few % of samples; the rest of the credit needs copying
the tool's character, a fixed distance back in the context.
"""

from __future__ import annotations

import random
from typing import Any

from workers.rollout.agent import Environment, ToolCall

CODE_CHARS = "123"
CALL_CREDIT = 0.2
ANSWER_CREDIT = 0.8
FORMAT_CREDIT = 0.1
CODE_REPEAT = 32


class VaultEnvironment(Environment):
    tool_names = ["vault"]

    def reset(self, sample: dict[str, Any], seed: int) -> None:
        self.code = random.Random(seed).choice(CODE_CHARS)
        self.calls = 0

    def step(self, call: ToolCall) -> str:
        self.calls += 1
        return self.code * CODE_REPEAT

    def reward(self, final_text: str) -> float:
        if not self.calls:
            return 0.0
        answer = final_text.strip()[:1]
        if answer == self.code:
            return CALL_CREDIT + ANSWER_CREDIT
        return CALL_CREDIT + (FORMAT_CREDIT if answer and answer in CODE_CHARS else 0.0)
