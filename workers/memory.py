"""Memory readings per phase, reported in the step metrics (`memory/<phase>/...`)."""

from __future__ import annotations

import os
import threading
import time

import psutil
import torch

GIB = float(1 << 30)
# How often the device-wide peak is sampled. PyTorch's allocator keeps freed blocks reserved until a phase
# empties its cache, so a short-lived allocation stays visible to the sampler well after it is freed.
PEAK_SAMPLE_INTERVAL_S = 0.01


def memory_reading(device: torch.device) -> dict[str, float]:
    """Device memory in use (whole GPU, all processes: total - free) and this process's allocations; on
    CPU, the process's resident memory. `peak_allocated_gib` is the allocator's peak since its last reset,
    which `MemoryLog.record` makes at every reading: there it is the phase's own.

    PyTorch's allocator figures (`allocated_gib`, `reserved_gib`, `peak_allocated_gib`) count every memory pool
    of the process, a hybrid vLLM engine's too: its CuMemAllocator makes the engine's weights and KV cache
    through a `torch.cuda.MemPool`, and PyTorch keeps counting those blocks while the engine sleeps with their
    memory unmapped. With such an engine they can exceed the device (182.5 GiB peak in a 7B update on a 140 GiB
    H200); `gpu_used_gib` and `MemoryLog`'s `gpu_used_peak_gib` (NVML) are what the device holds."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return {
            "gpu_used_gib": (total - free) / GIB,
            "allocated_gib": torch.cuda.memory_allocated(device) / GIB,
            "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
            **allocator_counts(device),
        }
    return {"rss_gib": psutil.Process(os.getpid()).memory_info().rss / GIB}


def allocator_counts(device: torch.device) -> dict[str, float]:
    """The caching allocator's counts since the process started: device allocations (cudaMalloc, each a
    possible pause) and retries (an allocation that failed, emptied the cache and tried again: memory pressure
    or fragmentation). Rising counts between steps mean the allocator, not the kernels, costs time."""
    stats = torch.cuda.memory_stats(device)
    return {
        "device_allocs_total": float(stats.get("num_device_alloc", 0)),
        "alloc_retries_total": float(stats.get("num_alloc_retries", 0)),
    }


class DevicePeak:
    """The whole device's highest used memory (NVML, as nvidia-smi shows it: every process, PyTorch's cache,
    vLLM's memory pool) between two `take()`s, sampled in a daemon thread. Unlike the allocator's peak it
    does not count a sleeping vLLM engine's unmapped memory."""

    def __init__(self, device: torch.device, interval_s: float = PEAK_SAMPLE_INTERVAL_S) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peak = self._used()  # raises where NVML is unavailable
        self._window = 0  # which take() interval a reading belongs to
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._sample, name="device-memory-peak", daemon=True)
        self._thread.start()

    def _used(self) -> int:
        return torch.cuda.device_memory_used(self.device)

    def _sample(self) -> None:
        while True:
            window = self._window
            used = self._used()
            with self._lock:
                # A reading taken before a take() belongs to the interval that take() closed, not the next one
                # (a phase that ends by freeing memory would otherwise pass its peak on to the next phase).
                if window == self._window:
                    self.peak = max(self.peak, used)
            time.sleep(self.interval_s)

    def take(self) -> float:
        """GiB: the highest reading since the last call (or the start), then start over from now."""
        now = self._used()
        with self._lock:
            peak, self.peak = max(self.peak, now), now
            self._window += 1
        return peak / GIB


def device_peak(device: torch.device) -> DevicePeak | None:
    """A sampler of the device's used memory, or None off CUDA or without NVML (nvidia-ml-py)."""
    if device.type != "cuda":
        return None
    try:
        return DevicePeak(device)
    except Exception:  # noqa: BLE001 - no NVML bindings or driver: the other readings remain
        return None


class MemoryLog:
    """Readings taken after each phase of a step; `pop()` returns and clears them as flat metrics. On a GPU
    `gpu_used_peak_gib` is the device's highest use during the phase (since the previous reading), and
    `peak_allocated_gib` the allocator's (its peak is reset at each reading; what it counts: `memory_reading`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._metrics: dict[str, float] = {}
        self._peak = device_peak(device)

    def record(self, phase: str) -> None:
        for key, value in memory_reading(self.device).items():
            self._metrics[f"memory/{phase}/{key}"] = value
        if self._peak is not None:
            self._metrics[f"memory/{phase}/gpu_used_peak_gib"] = self._peak.take()
        if self.device.type == "cuda":  # the next reading's allocator peak is its phase's own, not the process's
            torch.cuda.reset_peak_memory_stats(self.device)

    def pop(self) -> dict[str, float]:
        metrics, self._metrics = self._metrics, {}
        return metrics
