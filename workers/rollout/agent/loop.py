"""The multi-turn loop: generate, parse tool calls, run them, append their results, generate again.

Conversations move independently. A conversation is *ready* when it waits for the model, *pending* while
its tool calls run; tool calls run in threads, so a slow tool delays only its own conversation. Two kinds
of engine drive the turns:

- a `StreamingTurnGenerator` (vLLM) batches continuously: a ready conversation's next turn is submitted at
  once and joins the engine's running batch; each engine step hands back the turns it finished. Between
  steps the loop picks up finished tool calls without waiting; when the engine is idle it waits for one.
- a `TurnGenerator` (HF generate) works in rounds: one `generate` call for every ready conversation. Engines
  that must call generate in step on every rank (HF generate under FSDP) set `lockstep`: each round then
  waits for all tool calls and the ranks agree whether any work is left.

A conversation ends at a turn without a tool call (the final answer), when its environment says done,
after `max_turns` model turns, or when the response budget (`response_length` tokens, model and tool
tokens together) runs out (`truncated`).
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from workers.rollout.agent.chat import ChatBridge
from workers.rollout.agent.environment import Environment
from workers.rollout.agent.parsers import ToolCallParser
from workers.rollout.agent.tools import ToolLimits, ToolOutcome, finished

NO_VERSION = -1  # the weights version of a token no model sampled (tool and template text)


@dataclass(frozen=True)
class AgentSettings:
    response_length: int  # the budget: model + tool tokens of one conversation
    max_turns: int
    max_tokens_per_turn: int
    limits: ToolLimits


@dataclass(frozen=True)
class TurnRequest:
    row: int
    turn: int
    context: list[int]  # prompt + everything so far
    max_tokens: int


@dataclass(frozen=True)
class TurnOutput:
    tokens: list[int]
    log_probs: list[float] | None = None
    versions: list[int] | None = None  # the weights version that sampled each token (asynchronous rollout)
    # Routing replay: the experts of every token the engine ran for this turn, in order from the conversation's
    # first token ([context + sampled tokens - 1, layers, k]); None when the rollout does not record them.
    routed_experts: torch.Tensor | None = None


class TurnGenerator(Protocol):
    lockstep: bool

    def generate(self, requests: list[TurnRequest]) -> list[TurnOutput]: ...

    def any_work(self, local: bool) -> bool:
        """Whether any rank still has work (lockstep engines: a collective)."""
        ...


@runtime_checkable
class StreamingTurnGenerator(Protocol):
    """An engine with continuous batching: turns go in one at a time and come back as they finish."""

    def submit(self, request: TurnRequest) -> None: ...

    def step(self) -> list[tuple[TurnRequest, TurnOutput]]:
        """Advance the engine by one step; the turns that step finished."""
        ...

    def in_flight(self) -> int: ...

    def cancel_all(self) -> None:
        """Drop every submitted turn (the rollout failed; the engine must be clean for the next call)."""
        ...


@dataclass
class Conversation:
    row: int
    prompt: list[int]
    env: Environment
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 = model token (trained), 0 = tool / template token
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # weights version per token, NO_VERSION on tool tokens
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    outputs_cut: int = 0
    truncated: bool = False
    hit_max_turns: bool = False
    done: bool = False
    pending: list[concurrent.futures.Future] = field(default_factory=list)
    ended_with_eos: bool = False
    final_text: str = ""  # the text of the model's last turn
    # The experts of the conversation's tokens as its latest turn's engine pass ran them (routing replay): each turn
    # runs the whole conversation so far, so the latest covers every earlier position; the tokens after it (its last
    # sampled token, a final tool message) were never run and are routed live.
    routing: torch.Tensor | None = None

    def append(
        self, tokens: list[int], model: bool, log_probs: list[float] | None = None, versions: list[int] | None = None
    ) -> None:
        self.response.extend(tokens)
        self.mask.extend([int(model)] * len(tokens))
        self.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(tokens))
        self.versions.extend(versions if versions is not None else [NO_VERSION] * len(tokens))


class AgentLoop:
    def __init__(
        self,
        generator: TurnGenerator | StreamingTurnGenerator,
        parser: ToolCallParser,
        bridge: ChatBridge,
        settings: AgentSettings,
    ) -> None:
        self.generator, self.parser, self.bridge, self.settings = generator, parser, bridge, settings

    def run(self, prompts: list[list[int]], envs: list[Environment]) -> list[Conversation]:
        conversations = [Conversation(row, list(p), env) for row, (p, env) in enumerate(zip(prompts, envs))]
        if isinstance(self.generator, StreamingTurnGenerator):
            self._run_streaming(self.generator, conversations)
        else:
            self._run_rounds(self.generator, conversations)
        return conversations

    def _run_rounds(self, generator: TurnGenerator, conversations: list[Conversation]) -> None:
        ready = list(conversations)
        while generator.any_work(bool(ready) or any(c.pending for c in conversations)):
            if ready or generator.lockstep:
                requests = [self.next_request(c) for c in ready]
                for conversation, output in zip(ready, generator.generate(requests)):
                    self.after_turn(conversation, output)
            wait = concurrent.futures.ALL_COMPLETED if generator.lockstep else concurrent.futures.FIRST_COMPLETED
            ready = self.ready_after_tools(conversations, wait)

    def _run_streaming(self, generator: StreamingTurnGenerator, conversations: list[Conversation]) -> None:
        try:
            for conversation in conversations:
                generator.submit(self.next_request(conversation))
            while generator.in_flight() or any(c.pending for c in conversations):
                busy = generator.in_flight() > 0
                if busy:
                    for request, output in generator.step():
                        self.after_turn(conversations[request.row], output)
                # While the engine works, finished tool calls are picked up without waiting for more.
                for conversation in self.ready_after_tools(
                    conversations, None if busy else concurrent.futures.FIRST_COMPLETED
                ):
                    generator.submit(self.next_request(conversation))
        except BaseException:
            generator.cancel_all()
            raise

    def _budget_left(self, conversation: Conversation) -> int:
        return self.settings.response_length - len(conversation.response)

    def next_request(self, conversation: Conversation) -> TurnRequest:
        """The conversation's next model turn (its context so far, within the budget left)."""
        limit = min(self.settings.max_tokens_per_turn, self._budget_left(conversation))
        return TurnRequest(conversation.row, conversation.turns, conversation.prompt + conversation.response, limit)

    def after_turn(self, conversation: Conversation, output: TurnOutput) -> None:
        """Append a finished model turn; the conversation then ends or starts its tool calls (`pending`)."""
        tokens = list(output.tokens)[: min(self.settings.max_tokens_per_turn, self._budget_left(conversation))]
        log_probs = None if output.log_probs is None else list(output.log_probs)[: len(tokens)]
        versions = None if output.versions is None else list(output.versions)[: len(tokens)]
        conversation.append(tokens, model=True, log_probs=log_probs, versions=versions)
        if output.routed_experts is not None:  # the positions this turn ran: its context and the kept tokens but one
            ran = len(conversation.prompt) + len(conversation.response) - 1
            conversation.routing = torch.as_tensor(output.routed_experts)[:ran]
        conversation.turns += 1
        conversation.ended_with_eos = self.bridge.ended_turn(tokens)
        conversation.final_text = self.bridge.decode(tokens)
        if not conversation.ended_with_eos and self._budget_left(conversation) == 0:
            conversation.truncated = conversation.done = True
            return
        parsed = self.parser.parse(conversation.final_text, conversation.env.tool_names)
        if not parsed.wants_tools:
            conversation.done = True
            return
        if conversation.turns >= self.settings.max_turns:
            conversation.hit_max_turns = conversation.done = True
            return
        limits = self.settings.limits
        conversation.pending = [conversation.env.run_call(call, limits) for call in parsed.calls]
        conversation.pending += [finished(f"error: {message}", error=True) for message in parsed.errors]
        conversation.tool_calls += len(conversation.pending)

    def ready_after_tools(self, conversations: list[Conversation], wait: str | None) -> list[Conversation]:
        """Conversations whose tool calls have all returned, with the results appended. `wait` (a
        `concurrent.futures` mode: all calls, or the first to return) waits first; None does not."""
        pending = [f for c in conversations for f in c.pending]
        if pending and wait is not None:
            concurrent.futures.wait(pending, return_when=wait)
        ready = []
        for conversation in conversations:
            if conversation.pending and all(f.done() for f in conversation.pending):
                outcomes = [f.result() for f in conversation.pending]
                conversation.pending = []
                self._append_results(conversation, outcomes)
                if not conversation.done:
                    ready.append(conversation)
        return ready

    def _append_results(self, conversation: Conversation, outcomes: list[ToolOutcome]) -> None:
        conversation.tool_errors += sum(o.error for o in outcomes)
        conversation.tool_timeouts += sum(o.timed_out for o in outcomes)
        conversation.outputs_cut += sum(o.output_cut for o in outcomes)
        tokens = self.bridge.between_turns(conversation.ended_with_eos, [o.text for o in outcomes])
        room = self._budget_left(conversation)
        conversation.append(tokens[:room], model=False)
        if len(tokens) >= room:  # no room left for the model to answer
            conversation.truncated = conversation.done = True
        elif conversation.env.done:
            conversation.done = True
