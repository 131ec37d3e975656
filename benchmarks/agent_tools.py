"""A tool with a chosen latency, for `benchmarks/agent_throughput.py --tool-delay-ms` (real tools such as search
or code execution take tens to hundreds of milliseconds)."""

from __future__ import annotations

import time


def calculate_slowly(expression: str, delay_s: float) -> str:
    """Waits `delay_s`, then answers the scripted expression (the benchmark only asks for 12 + 7 * 3)."""
    time.sleep(float(delay_s))
    return "33" if expression.replace(" ", "") == "12+7*3" else f"error: unexpected expression {expression!r}"
