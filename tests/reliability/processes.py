"""Run `python -m ...` in its own session with its own Ray cluster, watch its output, and clean up after it.

The child never inherits RAY_ADDRESS, so `init_ray` starts a private local cluster whose processes are
descendants of the child; `stop_leftovers` ends exactly those (by pid), never anything else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@contextmanager
def sigint_reaches_children() -> Iterator[None]:
    """Children started inside get Python's usual Ctrl-C. A background launcher (`cmd &` in a script) leaves SIGINT
    ignored, and an ignored signal stays ignored across exec (the child would then never see its Ctrl-C); a handled
    one is reset to the default there."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class ChildProcess:
    """A child process whose stdout+stderr go to `log_path`; remembers every descendant it has seen."""

    def __init__(self, args: list[str], log_path: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")
        with sigint_reaches_children():
            self.proc = subprocess.Popen(
                [sys.executable, *args],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=str(cwd or REPO_ROOT),
                env=child_env(**(env or {})),
                start_new_session=True,  # its own session: the test's terminal signals never reach it
            )
        self.seen: dict[int, psutil.Process] = {}

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def snapshot_descendants(self) -> list[psutil.Process]:
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass
        return list(self.seen.values())

    def live_descendant_names(self) -> list[str]:
        """Names of the descendants alive now; a short-lived one may exit between listing and reading."""
        names = []
        for process in self.snapshot_descendants():
            try:
                names.append(process.name())
            except psutil.NoSuchProcess:
                pass
        return names

    def wait_for(self, predicate, timeout_s: float, what: str) -> None:
        """Poll until `predicate()` holds; fail with the output's tail when the child exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.snapshot_descendants()
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"child exited ({self.proc.returncode}) before {what}:\n{self.output[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"no {what} within {timeout_s:.0f}s:\n{self.output[-4000:]}")

    def wait_exit(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stop_leftovers(self, grace_s: float = 15.0) -> list[str]:
        """Wait up to `grace_s` for every descendant seen to exit, SIGKILL the rest; returns their names."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        _, alive = psutil.wait_procs(list(self.seen.values()), timeout=grace_s)
        names = []
        for process in alive:
            try:
                names.append(f"{process.name()} (pid {process.pid})")
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._log.close()
        return names
