"""Tools the agent-loop tests load by file path (as a user's config would)."""

import asyncio
import time
from pathlib import Path

from workers.rollout.agent import Environment


def lookup(key: str) -> str:
    return {"apple": "red", "sky": "blue"}.get(key, "unknown")


def explode(**_) -> str:
    raise ValueError("tool exploded on purpose")


def hang(**_) -> str:
    time.sleep(30)
    return "never"


def flood(**_) -> str:
    return "x" * 100_000


async def async_echo(text: str) -> str:
    await asyncio.sleep(0.01)
    return f"echo {text}"


async def async_hang(**_) -> str:
    await asyncio.sleep(30)
    return "never"


def slow(seconds: float) -> str:
    time.sleep(float(seconds))
    return "slept"


class GateEnvironment(Environment):
    """One tool, `gate`: with `extra_info["gate"]` set, a call first creates the file `extra_info["started"]`,
    then waits (up to 120 s) until the file `gate` exists; otherwise it returns at once."""

    tool_names = ["gate"]

    def reset(self, sample, seed):
        info = sample.get("extra_info") or {}
        self.gate, self.started = info.get("gate"), info.get("started")

    def step(self, call):
        if self.gate:
            Path(self.started).touch()
            deadline = time.monotonic() + 120
            while not Path(self.gate).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return "open"
