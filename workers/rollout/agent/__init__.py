"""Multi-turn tool-calling rollouts (docs/agents.md): parsers, tools under limits, environments, the loop."""

from workers.rollout.agent.environment import Environment, ToolEnvironment
from workers.rollout.agent.parsers import ParsedTurn, ToolCall, make_parser

__all__ = ["Environment", "ParsedTurn", "ToolCall", "ToolEnvironment", "make_parser"]
