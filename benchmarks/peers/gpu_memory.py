"""Peak device memory in use while a command runs, read through NVML (no CUDA context of our own).

The same reading for both sides of a comparison: whatever each framework's processes hold on the GPU
(allocator caches, vLLM's KV cache and CUDA graphs, NCCL buffers, CUDA contexts), as `nvidia-smi` shows it.
"""

from __future__ import annotations

import threading
import time


class PeakGpuMemory:
    """Polls device 0's used memory every `interval_s` in a thread; `peak_gib` after `stop()`. Without NVML
    (a CPU dry run) both readings stay None."""

    def __init__(self, interval_s: float = 0.25, device: int = 0) -> None:
        self.interval_s = interval_s
        self.baseline_gib: float | None = None
        self.peak_gib: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        try:
            import pynvml  # nvidia-ml-py, in the GPU image

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        except Exception:  # no NVML library or no device: nothing to read
            self._nvml = None
            return
        self.baseline_gib = self.peak_gib = self._used_gib()

    def _used_gib(self) -> float:
        return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**30

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak_gib = max(self.peak_gib, self._used_gib())
            time.sleep(self.interval_s)

    def __enter__(self) -> "PeakGpuMemory":
        if self._nvml is not None:
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
