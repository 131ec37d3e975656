"""The driver of a run under cProfile, with its garbage collector's pauses counted apart.

A collection pauses whatever function is running, so cProfile spreads its time over the callers; the pauses
are summed here from the collector's own callbacks (per generation), to tell a slow function from a slow
collection. The profiler slows the driver: step times measured under it are not the benchmark's.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class GcPauses:
    """Seconds and counts of the collector's pauses, per generation, while installed."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            generation = int(info["generation"])
            self.seconds[generation] += time.perf_counter() - self._started
            self.counts[generation] += 1
            self._started = None

    @contextmanager
    def installed(self) -> Iterator["GcPauses"]:
        gc.callbacks.append(self)
        try:
            yield self
        finally:
            gc.callbacks.remove(self)

    def summary(self) -> str:
        parts = ", ".join(f"gen{g} {n} x, {s:.3f} s" for g, (n, s) in enumerate(zip(self.counts, self.seconds)))
        return f"garbage collection pauses: {sum(self.seconds):.3f} s ({parts})"


@contextmanager
def driver_profile(folder: Path | None, name: str) -> Iterator[None]:
    """With a folder: this process (the driver) under cProfile, its stats written there as `name`.prof and
    `name`.txt (the collector's pauses, then the top functions by cumulative time)."""
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    profiler, pauses = cProfile.Profile(), GcPauses()
    with pauses.installed():
        profiler.enable()
        try:
            yield
        finally:
            profiler.disable()
    profiler.dump_stats(folder / f"{name}.prof")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    (folder / f"{name}.txt").write_text(pauses.summary() + "\n" + text.getvalue())
