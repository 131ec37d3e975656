"""What was live on the GPU at a process's allocation peak, grouped by where it was allocated: the CUDA caching
allocator's trace (torch.cuda.memory._record_memory_history) recorded in every process that sets up CUDA, and
after each new high of allocated memory a text summary written to MEMORY_TRACE_DIR.

Used to find what the memory plan (trainer/memory_plan) misses in a phase: run the job with the directory set and
this module imported at interpreter start in every process (Ray's workers included), e.g. on a GPU machine

    echo "import benchmarks.memory_trace" > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/zz_trace.pth"
    MEMORY_TRACE_DIR=/tmp/trace python3 -m benchmarks.scale_step --sizes 14B --layers 12 --steps 2 ...

(the repository must be importable from site-packages, as on the device machine; remove the .pth after). Each
`<dir>/mem_<pid>_<n>.txt` lists the live allocations at the peak of the recorded window by call site (the first
project frame | the first library frame | the allocating frame) and the largest blocks with their stacks. The
window counts only allocations made after recording started; a sleeping vLLM engine's pool counts as live.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from typing import Any

TRACE_DIR_ENV = "MEMORY_TRACE_DIR"
PROJECT_PATHS = ("/workers/", "/trainer/", "/benchmarks/", "/protocol/", "/single_controller/")
LIBRARY_PATHS = ("transformers/", "torch/distributed/", "liger_kernel/", "vllm/", "torch/utils/checkpoint",
                 "torch/optim/", "torch/nn/functional", "torch/autograd")
GIB = 1 << 30
TRACE_ENTRIES = 1_000_000
NEW_HIGH_BYTES = 512 << 20  # a new summary after the allocated peak grows by this much


def frame_text(frame: dict[str, Any]) -> str:
    path = frame["filename"].split("site-packages/")[-1]
    return f"{path}:{frame['line']}:{frame['name']}"


def call_site(frames: list[dict[str, Any]]) -> str:
    """`first project frame | first library frame | allocating frame` ('-' where a stack has none)."""
    project = next((frame_text(f) for f in frames if any(p in f["filename"] for p in PROJECT_PATHS)), "-")
    library = next((frame_text(f) for f in frames if any(p in f["filename"] for p in LIBRARY_PATHS)), "-")
    return f"{project} | {library} | {frame_text(frames[0]) if frames else '-'}"


def live_at_peak(trace: list[dict[str, Any]]) -> tuple[int, int, list[dict[str, Any]]]:
    """(index of the peak event, bytes live then, the live allocations) over one device's trace, counting only
    allocations made inside the trace (frees of older ones are ignored)."""
    live: set[int] = set()
    current = best = 0
    best_index = -1
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            live.add(event["addr"])
            current += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in live:
            live.discard(event["addr"])
            current -= event["size"]
        if current > best:
            best, best_index = current, index
    alive: dict[int, dict[str, Any]] = {}
    for event in trace[: best_index + 1]:
        if event["action"] == "alloc":
            alive[event["addr"]] = event
        elif event["action"] == "free_completed":
            alive.pop(event["addr"], None)
    return best_index, best, list(alive.values())


def summarize(snapshot: dict[str, Any], groups: int = 40, largest: int = 15) -> str:
    """The text summary of a torch.cuda.memory._snapshot(): per device, the live bytes at the window's peak by
    call site, then the largest live blocks with their stacks."""
    lines = []
    for device, trace in enumerate(snapshot["device_traces"]):
        if not trace:
            continue
        index, peak, alive = live_at_peak(trace)
        sizes: Counter[str] = Counter()
        counts: Counter[str] = Counter()
        for event in alive:
            site = call_site(event.get("frames") or [])
            sizes[site] += event["size"]
            counts[site] += 1
        lines.append(f"device {device}: {len(trace)} events; peak of the window's allocations {peak / GIB:.2f} GiB "
                     f"at event {index}")
        lines += [f"  {size / GIB:8.3f} GiB x{counts[site]:5d}  {site}" for site, size in sizes.most_common(groups)]
        lines.append("  largest live blocks:")
        for event in sorted(alive, key=lambda e: -e["size"])[:largest]:
            stack = " <- ".join(frame_text(f) for f in (event.get("frames") or [])[:12])
            lines.append(f"    {event['size'] / GIB:7.3f} GiB  {stack}")
    return "\n".join(lines) + "\n"


def _watch(out_dir: str) -> None:
    """Wait for CUDA in this process, record its allocator's history, write a summary after each new high."""
    while "torch" not in sys.modules:
        time.sleep(0.5)
    torch = sys.modules["torch"]
    while not (hasattr(torch, "cuda") and torch.cuda.is_initialized()):
        time.sleep(0.5)
    torch.cuda.memory._record_memory_history(max_entries=TRACE_ENTRIES, stacks="python", context="alloc")
    written, count = 0, 0
    while True:
        time.sleep(1.0)
        peak = torch.cuda.max_memory_allocated()
        if peak <= written + NEW_HIGH_BYTES:
            continue
        written = peak
        time.sleep(3.0)  # let the phase free what it held at the peak, so the trace shows the moment whole
        header = (f"max_memory_allocated {peak / GIB:.2f} GiB, "
                  f"max_memory_reserved {torch.cuda.max_memory_reserved() / GIB:.2f} GiB\n")
        with open(os.path.join(out_dir, f"mem_{os.getpid()}_{count}.txt"), "w") as out:
            out.write(header + summarize(torch.cuda.memory._snapshot()))
        count += 1


def start_if_asked() -> bool:
    """Start the recorder thread when MEMORY_TRACE_DIR is set (a daemon: it never holds the process open)."""
    out_dir = os.environ.get(TRACE_DIR_ENV)
    if not out_dir:
        return False
    os.makedirs(out_dir, exist_ok=True)
    threading.Thread(target=_watch, args=(out_dir,), daemon=True, name="memory-trace").start()
    return True


start_if_asked()
