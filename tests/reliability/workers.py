"""A worker class for the fault tests (importable by Ray workers through PYTHONPATH)."""

from __future__ import annotations

import os
import time

from single_controller import Dispatch, Worker, register


class FaultyWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def fail_or_sleep(self, failing_rank: int, sleep_s: float) -> int:
        if self.rank == failing_rank:
            raise ValueError(f"deliberate failure on rank {self.rank}")
        time.sleep(sleep_s)  # the other ranks are still busy when the failure is reported
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank
