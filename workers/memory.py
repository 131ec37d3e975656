"""Memory readings per phase, reported in the step metrics (`memory/<phase>/...`)."""

from __future__ import annotations

import os

import psutil
import torch

GIB = float(1 << 30)


def memory_reading(device: torch.device) -> dict[str, float]:
    """Device memory in use (whole GPU, all processes: total - free) and this process's allocations; on
    CPU, the process's resident memory."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return {
            "gpu_used_gib": (total - free) / GIB,
            "allocated_gib": torch.cuda.memory_allocated(device) / GIB,
            "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
        }
    return {"rss_gib": psutil.Process(os.getpid()).memory_info().rss / GIB}


class MemoryLog:
    """Readings taken after each phase of a step; `pop()` returns and clears them as flat metrics."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._metrics: dict[str, float] = {}

    def record(self, phase: str) -> None:
        for key, value in memory_reading(self.device).items():
            self._metrics[f"memory/{phase}/{key}"] = value
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def pop(self) -> dict[str, float]:
        metrics, self._metrics = self._metrics, {}
        return metrics
