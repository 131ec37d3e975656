"""The driver of a run under cProfile, with its garbage collector's pauses counted apart.

A collection pauses whatever function is running, so cProfile spreads its time over the callers; the pauses
are summed here from the collector's own callbacks (per generation), to tell a slow function from a slow
collection. The profiler slows the driver: step times measured under it are not the benchmark's.

cProfile sees only the main thread and only time spent in Python calls; `StackSampler` looks at every thread
of the driver every few milliseconds, so a main thread held up by another thread (the GIL) or inside one long
call shows where it stands, and what the other threads were doing meanwhile.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.async_rollout import AsyncRollout


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


def _frames(frame: Any, depth: int) -> list[str]:
    """The innermost `depth` frames as 'file:line function', innermost last."""
    names = []
    while frame is not None and len(names) < depth:
        code = frame.f_code
        names.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return names[::-1]


def _within(frame: Any, function: str) -> bool:
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


class StackSampler:
    """Every thread's stack every `interval_s`; the main thread's samples inside `focus` (a function name) are
    tallied apart, with what each other thread was running at the same instants."""

    def __init__(self, focus: str, interval_s: float = 0.005, depth: int = 10) -> None:
        self.focus, self.interval_s, self.depth = focus, interval_s, depth
        self.stacks: dict[str, Counter] = {}
        self.focused: Counter = Counter()
        self.others_in_focus: Counter = Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def _run(self) -> None:
        main, own = threading.main_thread().ident, threading.get_ident()
        while not self._stop.wait(self.interval_s):
            names = {t.ident: t.name for t in threading.enumerate()}
            frames = sys._current_frames()
            self.samples += 1
            in_focus = main in frames and _within(frames[main], self.focus)
            for ident, frame in frames.items():
                if ident == own:
                    continue
                name = names.get(ident, str(ident))
                stack = " > ".join(_frames(frame, self.depth))
                self.stacks.setdefault(name, Counter())[stack] += 1
                if in_focus and ident == main:
                    self.focused[stack] += 1
                elif in_focus:
                    self.others_in_focus[f"[{name}] {' > '.join(_frames(frame, 3))}"] += 1

    @contextmanager
    def running(self) -> Iterator["StackSampler"]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()

    def summary(self, top: int = 25) -> str:
        ms = self.interval_s * 1e3
        lines = [f"{self.samples} samples, one every {ms:.0f} ms (a count of n is about n x {ms:.0f} ms)", ""]
        lines.append(f"== main thread inside {self.focus}: {sum(self.focused.values())} samples")
        lines += [f"{n:6d}  {stack}" for stack, n in self.focused.most_common(top)]
        lines.append(f"== the other threads at those instants")
        lines += [f"{n:6d}  {stack}" for stack, n in self.others_in_focus.most_common(top)]
        for name, stacks in sorted(self.stacks.items(), key=lambda item: -sum(item[1].values())):
            lines.append(f"== thread {name}: {sum(stacks.values())} samples")
            lines += [f"{n:6d}  {stack}" for stack, n in stacks.most_common(top)]
        return "\n".join(lines) + "\n"


@contextmanager
def driver_profile(folder: Path | None, name: str) -> Iterator[None]:
    """With a folder: this process (the driver) under cProfile, its stats written there as `name`.prof and
    `name`.txt (the collector's pauses, then the top functions by cumulative time), and `name`.stacks.txt
    (the stack samples, those inside the asynchronous wait for a batch apart)."""
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    profiler, pauses, sampler = cProfile.Profile(), GcPauses(), StackSampler(focus=AsyncRollout._wait_for_batch.__name__)
    with pauses.installed(), sampler.running():
        profiler.enable()
        try:
            yield
        finally:
            profiler.disable()
    profiler.dump_stats(folder / f"{name}.prof")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(60)
    (folder / f"{name}.txt").write_text(pauses.summary() + "\n" + text.getvalue())
    (folder / f"{name}.stacks.txt").write_text(sampler.summary())
