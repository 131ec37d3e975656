"""Peak device memory in use while a command runs, read through NVML (no CUDA context of our own), per GPU.

The same reading for every side of a comparison: whatever each framework's processes hold on each GPU
(allocator caches, vLLM's KV cache and CUDA graphs, NCCL buffers, CUDA contexts), as `nvidia-smi` shows it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping


def visible_devices(env: Mapping[str, str]) -> list[int]:
    """The NVML indices a process with environment `env` uses: CUDA_VISIBLE_DEVICES's numbers, else device 0."""
    listed = [item.strip() for item in env.get("CUDA_VISIBLE_DEVICES", "0").split(",")]
    return [int(item) for item in listed if item.isdigit()] or [0]


class PeakGpuMemory:
    """Polls the used memory of `devices` (NVML indices) every `interval_s` in a thread. After `stop()`:
    `peaks_gib` per device, `peak_gib` the highest of them (the fullest GPU), `baseline_gib` the highest at the
    start. Without NVML (a CPU dry run) the readings stay None."""

    def __init__(self, interval_s: float = 0.25, devices: list[int] | None = None) -> None:
        self.interval_s = interval_s
        self.baseline_gib: float | None = None
        self.peaks_gib: list[float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        try:
            import pynvml  # nvidia-ml-py, in the GPU image

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (devices or [0])]
        except Exception:  # no NVML library or no device: nothing to read
            self._nvml = None
            return
        self.peaks_gib = self._used_gib()
        self.baseline_gib = max(self.peaks_gib)

    @property
    def peak_gib(self) -> float | None:
        return max(self.peaks_gib) if self.peaks_gib else None

    def _used_gib(self) -> list[float]:
        return [self._nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30 for handle in self._handles]

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peaks_gib = [max(peak, now) for peak, now in zip(self.peaks_gib, self._used_gib())]
            time.sleep(self.interval_s)

    def __enter__(self) -> "PeakGpuMemory":
        if self._nvml is not None:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
