"""The benchmarks' steady state of a metric: its mean over steps 2..N (step 1 carries the start-up: CUDA graphs,
NCCL, allocator and vLLM warm-up). Free of torch, so a light script (the GPU suite's runner) reads it too."""

from __future__ import annotations

from typing import Any


def steady(history: list[dict[str, Any]], key: str) -> float:
    """Mean of `key` over the records after the first (all records when only the first has it); nan without any."""
    values = [r[key] for r in history[1:] if key in r] or [r[key] for r in history if key in r]
    return sum(values) / len(values) if values else float("nan")
