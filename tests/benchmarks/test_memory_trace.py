"""benchmarks/memory_trace.py: the live allocations at a trace's peak, grouped by call site."""

from benchmarks.memory_trace import live_at_peak, start_if_asked, summarize

GIB = 1 << 30
WORKER = {"filename": "/repo/workers/fsdp/optim.py", "line": 83, "name": "clipped_step"}
FSDP = {"filename": "/env/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", "line": 59,
        "name": "allocate"}


def _alloc(addr, gib, *frames):
    return {"action": "alloc", "addr": addr, "size": int(gib * GIB), "frames": list(frames)}


def _free(addr, gib):
    return [{"action": "free_requested", "addr": addr, "size": int(gib * GIB)},
            {"action": "free_completed", "addr": addr, "size": int(gib * GIB)}]


def test_the_peak_and_what_was_live_then_by_call_site():
    trace = [
        _alloc(1, 2.0, FSDP, WORKER),
        *_free(99, 50.0),  # allocated before recording started: ignored, not negative
        _alloc(2, 1.0, FSDP, WORKER),
        _alloc(3, 0.5, WORKER),
        *_free(2, 1.0),
        _alloc(4, 0.25, WORKER),  # after the peak: not live at it
    ]
    index, peak, alive = live_at_peak(trace)
    assert peak == int(3.5 * GIB) and trace[index]["addr"] == 3
    assert sorted(e["addr"] for e in alive) == [1, 2, 3]
    text = summarize({"device_traces": [[], trace]})
    assert text.startswith("device 1: 8 events; peak of the window's allocations 3.50 GiB")
    fsdp_line = next(line for line in text.splitlines() if "_fsdp_collectives.py:59:allocate" in line)
    # both FSDP blocks under one call site: project frame | library frame | allocating frame
    assert "3.000 GiB x    2" in fsdp_line and fsdp_line.strip().endswith(
        "/repo/workers/fsdp/optim.py:83:clipped_step | torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:59:"
        "allocate | torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:59:allocate")
    assert "largest live blocks:" in text and "2.000 GiB  torch/distributed/fsdp" in text


def test_nothing_starts_without_the_directory(monkeypatch):
    monkeypatch.delenv("MEMORY_TRACE_DIR", raising=False)
    assert start_if_asked() is False
