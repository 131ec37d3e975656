"""How the test processes of a distributed run (pytest-xdist) shared the work: per process, the seconds spent in
tests and when its last test ended, printed at the end of the run; per test file, its seconds, kept in pytest's
cache (`process_timeline/file_seconds`) to compare orderings. One process left alone with a long file at the end
shows here as the other's idle time."""

import time
from collections import defaultdict

import pytest

CACHE_KEY = "process_timeline/file_seconds"


class ProcessTimeline:
    """A controller-side plugin: reads the reports the test processes send back."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.monotonic()
        self.busy_s: dict[str, float] = defaultdict(float)
        self.last_end_s: dict[str, float] = {}
        self.file_s: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # set by pytest-xdist on reports from a test process
        if node is None:
            return
        process = node.gateway.id
        self.busy_s[process] += report.duration
        self.last_end_s[process] = time.monotonic() - self.started
        self.file_s[report.nodeid.partition("::")[0]] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.busy_s:
            return
        end_s = time.monotonic() - self.started
        terminalreporter.section("test processes")
        for process in sorted(self.busy_s):
            last = self.last_end_s[process]
            terminalreporter.write_line(
                f"{process}: {self.busy_s[process]:.0f} s in tests; its last test ended at {last:.0f} s"
                f" of {end_s:.0f} s ({end_s - last:.0f} s with nothing left to take)"
            )
        cache = getattr(self.config, "cache", None)  # absent under -p no:cacheprovider
        if cache is not None:
            cache.set(CACHE_KEY, dict(sorted(self.file_s.items(), key=lambda kv: -kv[1])))


def register(config: pytest.Config) -> None:
    """On the controller of a distributed run only (a test process has `workerinput`)."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ProcessTimeline(config), "process_timeline")
