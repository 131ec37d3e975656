"""`console`: one line per step with the headline metrics."""

from __future__ import annotations

from typing import Any, Callable

CONSOLE_KEYS = ("reward/mean", "val/reward_mean", "actor/pg_loss", "actor/kl_loss", "timing/step_s", "perf/tokens_per_s")


class ConsoleTracker:
    def __init__(self, print_fn: Callable[[str], Any] = print, **run: Any) -> None:
        self.print_fn = print_fn

    def log(self, metrics: dict[str, Any], step: int) -> None:
        shown = [f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if isinstance(metrics.get(k), (int, float))]
        self.print_fn(f"step {step}: " + "  ".join(shown))
