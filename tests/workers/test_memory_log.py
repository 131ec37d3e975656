"""The workers' per-phase memory readings (workers/memory.py): each reading's allocator peak is its phase's own,
not the process's so far, because `MemoryLog.record` resets the peak at every reading."""

from __future__ import annotations

import pytest
import torch

from workers import memory
from workers.memory import GIB, MemoryLog


class FakeAllocator:
    """PyTorch's allocator statistics as the caching allocator keeps them, for a CUDA device on a machine
    without one: bytes allocated now, their peak since the last reset, and the resets made."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.allocated = self.peak = 0
        self.resets = 0

    def allocate(self, size: int) -> None:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)

    def free(self, size: int) -> None:
        self.allocated -= size

    def reset_peak(self, device: torch.device) -> None:
        self.peak = self.allocated
        self.resets += 1

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (self.total - self.allocated, self.total))
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: self.allocated)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: self.peak)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: {})
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset_peak)
        monkeypatch.setattr(memory, "device_peak", lambda device: None)  # no NVML here


def test_each_reading_has_its_phases_own_allocator_peak(monkeypatch):
    allocator = FakeAllocator(total=80 * GIB)
    allocator.install(monkeypatch)
    log = MemoryLog(torch.device("cuda", 0))
    high, kept, later = 8 * GIB, 1 * GIB, 2 * GIB
    allocator.allocate(high)  # a phase that peaks high, then frees all but `kept`
    allocator.free(high - kept)
    log.record("update_actor")
    allocator.allocate(later)  # the next phase peaks lower
    allocator.free(later)
    log.record("generate")
    log.record("idle")  # nothing allocated: the peak is what stays allocated
    metrics = log.pop()
    assert metrics["memory/update_actor/peak_allocated_gib"] == high / GIB
    assert metrics["memory/generate/peak_allocated_gib"] == (kept + later) / GIB  # not the earlier phase's `high`
    assert metrics["memory/idle/peak_allocated_gib"] == kept / GIB
    assert allocator.resets == 3  # once per reading, after it
    assert log.pop() == {}


def test_no_allocator_reset_on_the_cpu(monkeypatch):
    def fail(device: torch.device) -> None:
        raise AssertionError("the CPU has no CUDA allocator to reset")

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fail)
    log = MemoryLog(torch.device("cpu"))
    log.record("update_actor")
    assert set(log.pop()) == {"memory/update_actor/rss_gib"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the caching allocator is CUDA's")
def test_on_a_gpu_each_reading_has_its_phases_peak_and_a_private_pool_counts():
    device = torch.device("cuda")
    big, small, pooled = 256 << 20, 16 << 20, 64 << 20
    log = MemoryLog(device)
    log.record("before")
    block = torch.empty(big, dtype=torch.uint8, device=device)
    del block
    log.record("big")
    block = torch.empty(small, dtype=torch.uint8, device=device)
    del block
    log.record("small")
    # A private pool, as a hybrid vLLM engine's CuMemAllocator makes for its weights and KV cache: PyTorch's
    # allocator figures count it (and keep counting it while the engine sleeps with that memory unmapped), which
    # is why the benchmarks' summaries show NVML's peak rather than the allocator's (workers/memory.py).
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        held = torch.empty(pooled, dtype=torch.uint8, device=device)
    log.record("pooled")
    metrics = log.pop()
    base = metrics["memory/before/allocated_gib"]
    assert metrics["memory/big/peak_allocated_gib"] >= base + big / GIB
    assert base + small / GIB <= metrics["memory/small/peak_allocated_gib"] < base + big / GIB  # its own, not big's
    assert metrics["memory/pooled/allocated_gib"] >= base + pooled / GIB
    assert metrics["memory/pooled/peak_allocated_gib"] >= base + pooled / GIB
    del held, pool
    torch.cuda.empty_cache()  # later tests read the allocator's reserve: leave none of this test's behind
