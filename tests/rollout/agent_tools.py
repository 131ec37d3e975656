"""Tools the agent-loop tests load by file path (as a user's config would)."""

import asyncio
import time


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
