"""User tools: loading them from the files the config names, and running one call under limits.

A tool is a plain Python function (sync or `async def`) taking keyword arguments and returning anything
printable. Every call runs in its own daemon thread with a time limit; the result text is cut at a size
cap. A tool that raises, hangs or floods output becomes an error message for the model, never an exception
in the rollout. A sync tool that never returns cannot be killed from Python: its thread is abandoned (it
holds no lock the rollout needs) and the call reports a timeout.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from workers.user_code import load_python_file


@dataclass(frozen=True)
class ToolLimits:
    timeout_s: float = 10.0
    max_output_chars: int = 2048


@dataclass(frozen=True)
class ToolOutcome:
    """What the model sees (`text`) and what the metrics count."""

    text: str
    error: bool = False
    timed_out: bool = False
    output_cut: bool = False


def load_object(spec: str, what: str) -> Any:
    """`path/to/file.py:name` (the file run as a fresh module) or `package.module:name` (imported) -> that
    attribute. Only what the config names is loaded; nothing is evaluated from text."""
    path, sep, name = spec.rpartition(":")
    dotted = bool(re.fullmatch(r"[A-Za-z_][\w.]*", path)) and not path.endswith(".py")
    if not sep or not (path.endswith(".py") or dotted) or not name.isidentifier():
        raise ValueError(f"{what} {spec!r} must look like 'path/to/file.py:name' or 'package.module:name'")
    module = importlib.import_module(path) if dotted else load_python_file(path, what)
    if not hasattr(module, name):
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"{what} {spec!r}: {path} defines no {name!r}; callables there: {available}")
    return getattr(module, name)


def load_tools(specs: list[str]) -> dict[str, Callable[..., Any]]:
    """Tool name (the function's name) -> function, in config order."""
    tools: dict[str, Callable[..., Any]] = {}
    for spec in specs:
        function = load_object(spec, "tool")
        if not callable(function):
            raise TypeError(f"tool {spec!r} is a {type(function).__name__}, not a function")
        if function.__name__ in tools:
            raise ValueError(f"two tools are named {function.__name__!r}; tool names must be unique")
        tools[function.__name__] = function
    return tools


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def cap_text(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return f"{text[:max_chars]}\n[output cut: {len(text)} chars, limit {max_chars}]", True


def _invoke(function: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float) -> Any:
    result = function(**kwargs)
    if inspect.isawaitable(result):
        # An async tool gets its own event loop; wait_for cancels it cleanly at the limit.
        async def bounded() -> Any:
            return await asyncio.wait_for(result, timeout_s)

        result = asyncio.run(bounded())
    return result


def call_tool(name: str, function: Callable[..., Any], kwargs: dict[str, Any], limits: ToolLimits) -> Future:
    """Start one call now; the future resolves to a `ToolOutcome` within about `timeout_s`."""
    future: Future = Future()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = _invoke(function, kwargs, limits.timeout_s)
        except BaseException as error:  # the tool's failure is the model's information, not ours
            box["error"] = error

    def supervise() -> None:
        worker = threading.Thread(target=work, name=f"tool-{name}", daemon=True)
        worker.start()
        worker.join(limits.timeout_s + 0.05)
        future.set_result(outcome_of(name, box, worker.is_alive(), limits))

    threading.Thread(target=supervise, name=f"tool-{name}-watch", daemon=True).start()
    return future


def outcome_of(name: str, box: dict[str, Any], still_running: bool, limits: ToolLimits) -> ToolOutcome:
    error = box.get("error")
    if still_running or isinstance(error, asyncio.TimeoutError):
        return ToolOutcome(f"error: tool {name!r} timed out after {limits.timeout_s:g} s", error=True, timed_out=True)
    if error is not None:
        message, _ = cap_text(f"error: tool {name!r} raised {type(error).__name__}: {error}", limits.max_output_chars)
        return ToolOutcome(message, error=True)
    try:
        text = as_text(box.get("value"))
    except Exception as failure:  # a result whose __str__ raises
        return ToolOutcome(f"error: tool {name!r} returned an unprintable {type(failure).__name__}", error=True)
    text, cut = cap_text(text, limits.max_output_chars)
    return ToolOutcome(text, output_cut=cut)


def finished(text: str, error: bool = False) -> Future:
    """An already-resolved outcome (unknown tool, unreadable call)."""
    future: Future = Future()
    future.set_result(ToolOutcome(text, error=error))
    return future
