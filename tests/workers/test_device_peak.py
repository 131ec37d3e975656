"""The device-wide peak sampler keeps each reading in the interval it was taken in (no GPU needed)."""

from __future__ import annotations

import threading

import torch

from workers.memory import GIB, DevicePeak


class ScriptedPeak(DevicePeak):
    """A sampler whose readings come from a script; the thread's reading can be held until released."""

    def __init__(self) -> None:
        self.level = 70 * GIB
        self.sampler_reading = threading.Event()  # set while the sampler thread waits inside a reading
        self.release = threading.Event()
        self.hold_next = False
        super().__init__(torch.device("cpu"), interval_s=0.001)

    def _used(self) -> int:
        level = self.level
        if self.hold_next and threading.current_thread() is self._thread:
            self.hold_next = False
            self.sampler_reading.set()
            self.release.wait(5)
        return level


def test_a_reading_taken_before_take_does_not_leak_into_the_next_interval():
    peak = ScriptedPeak()
    peak.hold_next = True
    assert peak.sampler_reading.wait(5)  # the thread has read 70 GiB and is about to record it
    peak.level = 16 * GIB  # the phase frees its memory, then ends
    assert peak.take() == 70.0
    peak.release.set()
    threading.Event().wait(0.05)  # the thread records its stale reading, then samples 16 GiB
    assert peak.take() == 16.0  # the next phase never held 70 GiB


def test_the_highest_reading_of_an_interval_is_kept():
    peak = ScriptedPeak()
    peak.level = 30 * GIB
    threading.Event().wait(0.05)
    peak.level = 10 * GIB
    threading.Event().wait(0.05)
    assert peak.take() == 70.0  # the starting level was the highest
    peak.level = 40 * GIB
    threading.Event().wait(0.05)
    peak.level = 5 * GIB
    threading.Event().wait(0.05)
    assert peak.take() == 40.0
