"""`GenerationStream`: a background thread stepping the engine over every prompt group submitted, while the
worker keeps answering calls (new prompts, collecting finished groups, weight updates).

The engine is touched by one thread at a time. The stream thread takes it for one iteration (admit new
groups, one engine step, hand finished turns to their episodes, pick up finished tool calls, move finished
groups to the outbox); `pause()` waits for the iteration in progress to end and parks the running turns, so
the worker's thread can load weights (or run a synchronous generate) on an idle engine; `resume()` submits
the parked turns again, continued or restarted according to `partial_rollout` when the weights changed.

`collect()` never waits for an engine step: whoever owns the engine (the stream thread at the end of each
iteration, the pauser) publishes the oldest weights version of every group in progress, together with the
groups it finished, and `collect()` answers from that. The step in progress can only give groups that had
no token yet (those it admits, reported as None) their first tokens, from the engine's current weights,
which the driver synced to its own version before collecting: such a group is not due for a step
(`trainer/async_buffer.py`) when max_staleness >= 1, and with max_staleness 0 every finished group is due
anyway, so the step never waits for one in progress. Publishing costs one look at each active group's
first token per engine step.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from protocol import DataProto
from workers.rollout.stream.episodes import GroupFactory, PromptGroup
from workers.rollout.stream.jobs import ContinuousEngine, TurnJob

TOOL_POLL_S = 0.01  # how often an idle engine looks at tool calls in flight
# The process's GIL switch interval while a stream runs. With tensor parallel 1 the engine steps in this
# process, and its Python (scheduler, inputs, outputs) holds the GIL; the worker's thread answering a driver
# call needs it several times per call and waits up to the interval each time. Measured with a Ray actor
# whose other thread runs Python: a trivial call took 8.8 ms (median) at CPython's default 5 ms, 1.2 ms at
# 0.5 ms, 0.7 ms with that thread idle. A thread alone is never interrupted, so idle costs nothing.
GIL_SWITCH_S = 0.0005


@dataclass(frozen=True)
class StreamSettings:
    max_staleness: int
    stale_groups: str  # wait | drop | regenerate (trainer/rollout_settings.py checks the config)
    partial_rollout: str  # continue | abort


class GenerationStream:
    def __init__(self, engine: ContinuousEngine, factory: GroupFactory, settings: StreamSettings) -> None:
        self.engine, self.factory, self.settings = engine, factory, settings
        self._cv = threading.Condition()
        self._inbox: list[PromptGroup] = []
        self._outbox: list[DataProto] = []
        self._stale: list[str] = []  # uids of groups dropped in flight for staleness, not yet reported
        self.active: list[PromptGroup] = []  # stream thread's (or the pauser's) while paused
        self._admitting: list[PromptGroup] = []  # taken from the inbox by the iteration in progress
        self._oldest: dict[str, int | None] = {}  # uid -> oldest token version of `active`, as last published
        self._group_of: dict[int, PromptGroup] = {}  # id(episode) -> its group
        self._tool_waiters: list[Any] = []  # episodes whose tool calls run
        self._stepping = False
        self._claims = 0  # callers waiting for the engine: the stream thread lets them in first
        self._pause_depth = 0
        self._version_at_pause = engine.version
        self._stopped = False
        self.error: str | None = None
        self._switch_before = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_before, GIL_SWITCH_S))
        self._thread = threading.Thread(target=self._run, name="rollout-stream", daemon=True)
        self._thread.start()

    # ---- called from the worker's thread ----------------------------------------------------------------
    def submit(self, groups: list[PromptGroup]) -> None:
        with self._cv:
            self._inbox.extend(groups)
            self._cv.notify_all()

    def collect(self, wait_s: float) -> dict[str, Any]:
        """Finished groups (their rollout rows, one DataProto), uids dropped in flight as too stale, and the
        oldest weights version of every group still in progress (None before its first token). Waits up to
        `wait_s` for a finished group when there is none."""
        with self._cv:
            if not self._outbox and wait_s > 0:
                self._cv.wait_for(lambda: bool(self._outbox) or self.error is not None, timeout=wait_s)
            self._raise_if_failed()
            finished, self._outbox = self._outbox, []
            stale, self._stale = self._stale, []
            # What the engine's owner published with the outbox: no wait for the engine step in progress.
            in_progress = {**self._oldest, **{g.uid: None for g in [*self._admitting, *self._inbox]}}
        return {"rollout": DataProto.concat(finished) if finished else None, "stale": stale, "in_progress": in_progress}

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The engine idle and owned by the caller (nested pauses: the outermost parks and resumes)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pause(self) -> None:
        with self._cv:
            self._pause_depth += 1
            if self._pause_depth > 1:
                return
            self._claims += 1
            self._cv.wait_for(lambda: not self._stepping)
            self._claims -= 1
            self._raise_if_failed()
            self._version_at_pause = self.engine.version
            self.engine.park()
            self._publish()

    def set_version(self, version: int) -> None:
        """The weights the engine now holds (call while paused)."""
        if self._pause_depth == 0:
            raise RuntimeError("GenerationStream.set_version must be called while paused")
        self.engine.version = version

    def resume(self) -> None:
        with self._cv:
            self._pause_depth -= 1
            if self._pause_depth > 0:
                return
            try:
                changed = self.engine.version != self._version_at_pause
                if changed and self.settings.stale_groups != "wait":
                    self._drop_stale(self.engine.version - self.settings.max_staleness)
                self.engine.resume(restart=changed and self.settings.partial_rollout == "abort")
                self._publish()  # restarted turns have no tokens any more; dropped groups are gone
            finally:
                self._cv.notify_all()

    def stop(self) -> None:
        """End the thread and drop everything in progress (prompts and finished groups not collected)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        self._thread.join(timeout=60)
        with self._cv:
            if not self._thread.is_alive():
                self.engine.forget_all()
            self.active, self._inbox, self._outbox, self._tool_waiters = [], [], [], []
            self._admitting, self._oldest = [], {}
        sys.setswitchinterval(self._switch_before)

    def _drop_stale(self, floor: int) -> None:
        """Groups in progress with a token older than `floor` can never be trained on: take them out now."""
        stale = [g for g in self.active if (oldest := g.oldest_version()) is not None and oldest < floor]
        if not stale:
            return
        self.engine.forget(e for g in stale for e in g.episodes)
        self._retire(stale)
        self._stale.extend(g.uid for g in stale)

    def _retire(self, groups: list[PromptGroup]) -> None:
        """Take `groups` out of the active ones (finished, or dropped as stale)."""
        gone = set(map(id, groups))
        self.active = [g for g in self.active if id(g) not in gone]
        self._tool_waiters = [e for e in self._tool_waiters if id(self._group_of[id(e)]) not in gone]
        for group in groups:
            for episode in group.episodes:
                self._group_of.pop(id(episode), None)

    def _publish(self) -> None:
        """Record the oldest version of every active group (by the engine's owner, holding the condition)."""
        self._oldest = {g.uid: g.oldest_version() for g in self.active}

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the rollout stream's generation thread failed:\n{self.error}")

    # ---- the stream thread ------------------------------------------------------------------------------
    def _wait_for_work(self, tools_due: bool) -> bool:
        """Wait (holding the condition) until an iteration may run; False when the stream was stopped.
        Tool calls in flight with an idle engine are looked at every TOOL_POLL_S."""
        while not self._stopped:
            if not (self._pause_depth or self._claims):
                if self._inbox or self.engine.busy() or (self._tool_waiters and tools_due):
                    return True
            timed_out = not self._cv.wait(timeout=TOOL_POLL_S if self._tool_waiters else None)
            tools_due = tools_due or timed_out
        return False

    def _run(self) -> None:
        try:
            tools_due = True
            while True:
                with self._cv:
                    if not self._wait_for_work(tools_due):
                        return
                    self._stepping = True
                    new, self._inbox = self._inbox, []
                    self._admitting = new
                    tools_due = False
                finished: list[DataProto] = []
                try:
                    finished = self._iteration(new)
                finally:
                    with self._cv:
                        self._stepping = False
                        self._outbox.extend(finished)
                        self._admitting = []
                        self._publish()
                        self._cv.notify_all()
        except BaseException:  # noqa: BLE001 - reported to the driver by the next collect/pause
            with self._cv:
                self.error = traceback.format_exc()
                self._stepping = False
                self._cv.notify_all()

    def _iteration(self, new: list[PromptGroup]) -> list[DataProto]:
        touched: dict[int, PromptGroup] = {}
        for group in new:
            self.active.append(group)
            for episode in group.episodes:
                self._group_of[id(episode)] = group
                self._add(episode.start())
        if self.engine.busy():
            for job in self.engine.step():
                episode = job.owner
                self._add(episode.after_turn(job))
                if episode.waiting_for_tools():
                    self._tool_waiters.append(episode)
                group = self._group_of[id(episode)]
                touched[id(group)] = group
        still_waiting = []
        for episode in self._tool_waiters:
            self._add(episode.poll_tools())
            if episode.waiting_for_tools():
                still_waiting.append(episode)
            else:
                group = self._group_of[id(episode)]
                touched[id(group)] = group
        self._tool_waiters = still_waiting
        done = [g for g in touched.values() if g.finished()]
        self._retire(done)
        return [self.factory.batch(g) for g in done]

    def _add(self, jobs: list[TurnJob]) -> None:
        for job in jobs:
            self.engine.add(job)
