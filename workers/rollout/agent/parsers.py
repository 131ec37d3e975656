"""Finding tool calls in a model turn's text, one parser per chat format.

`hermes`: Qwen2.5 / Hermes style, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (any number
per turn). `tiny`: for the embedded character-level tiny model, `!` starts a call of the first tool and the
rest of the turn is its single argument `arg` (short enough for a random model to stumble on).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """The calls of one turn; `errors` holds one message per call that could not be read (bad JSON, ...)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


class ToolCallParser(Protocol):
    def parse(self, text: str, tool_names: list[str]) -> ParsedTurn: ...


class HermesParser:
    """`<tool_call>{json}</tool_call>` blocks; an unclosed block at the end of a cut turn is an error too."""

    pattern = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str, tool_names: list[str]) -> ParsedTurn:
        turn = ParsedTurn()
        for block in self.pattern.findall(text):
            try:
                payload = json.loads(block.strip())
            except json.JSONDecodeError as error:
                turn.errors.append(f"tool call is not valid JSON ({error.msg} at char {error.pos})")
                continue
            if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
                turn.errors.append('tool call must be a JSON object {"name": str, "arguments": object}')
                continue
            arguments = payload.get("arguments", {})
            if isinstance(arguments, str):  # some models send the arguments JSON-encoded once more
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass
            if not isinstance(arguments, dict):
                turn.errors.append(f"arguments of tool call {payload['name']!r} must be a JSON object")
                continue
            turn.calls.append(ToolCall(payload["name"], arguments))
        return turn


class TinyParser:
    """`!` anywhere in the turn calls the first tool with `arg` = the text after it (stripped)."""

    marker = "!"

    def parse(self, text: str, tool_names: list[str]) -> ParsedTurn:
        if self.marker not in text:
            return ParsedTurn()
        if not tool_names:
            return ParsedTurn(errors=["no tools are configured"])
        argument = text.split(self.marker, 1)[1].strip()
        return ParsedTurn(calls=[ToolCall(tool_names[0], {"arg": argument})])


PARSERS: dict[str, type] = {"hermes": HermesParser, "tiny": TinyParser}


def make_parser(name: str) -> ToolCallParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call format {name!r}; valid formats: {sorted(PARSERS)}")
    return PARSERS[name]()
