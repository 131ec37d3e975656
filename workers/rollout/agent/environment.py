"""`Environment`: the stateful side of a multi-turn task, one instance per conversation.

The rollout calls `reset` once with the sample's fields, then `step` for every tool call the model makes
(its text becomes the tool message), and `reward` when the conversation ends. `step` runs under the same
time limit and output cap as a plain tool. Plain tools are served by `ToolEnvironment`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from workers.rollout.agent.parsers import ToolCall
from workers.rollout.agent.tools import ToolLimits, call_tool, finished


class Environment:
    """Subclass and override. `tool_names` lists the calls the model may make (the `tiny` format calls the
    first); `done` set to True ends the conversation after the current step."""

    tool_names: list[str] = []
    done: bool = False  # a class default, so subclasses need not call super().__init__()

    def reset(self, sample: dict[str, Any], seed: int) -> None:
        """`sample`: the row's non-tensor fields (data_source, reward_model, extra_info, ...)."""

    def step(self, call: ToolCall) -> Any:
        raise NotImplementedError

    def reward(self, final_text: str) -> float | None:
        """The episode's score given the model's last turn (its answer), or None to leave scoring to the
        configured reward function."""
        return None

    def run_call(self, call: ToolCall, limits: ToolLimits) -> Future:
        if call.name not in self.tool_names:
            return finished(f"error: unknown tool {call.name!r}; available: {self.tool_names}", error=True)
        return call_tool(call.name, lambda **_: self.step(call), {}, limits)


class ToolEnvironment(Environment):
    """Stateless: each call runs the named tool function with the call's arguments."""

    def __init__(self, tools: dict[str, Callable[..., Any]]) -> None:
        self.tools = tools
        self.tool_names = list(tools)

    def step(self, call: ToolCall) -> Any:
        return self.tools[call.name](**call.arguments)
