"""The memory of the driver machine's GPU, read through NVML (no CUDA context is created: the driver process
must not hold GPU memory for the whole run), or `nvidia-smi` where the NVML bindings are not installed."""

from __future__ import annotations

import os
import shutil
import subprocess

GIB = 1 << 30


def _visible(count: int) -> list[int]:
    """Indices of the devices CUDA_VISIBLE_DEVICES leaves visible (all when unset or given as UUIDs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    picked = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return [i for i in picked if i < count] if picked or not visible.strip() else list(range(count))


def _nvml_totals() -> list[int] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no device: nothing to detect
        return []
    try:
        count = pynvml.nvmlDeviceGetCount()
        return [int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total) for i in _visible(count)]
    finally:
        pynvml.nvmlShutdown()


def _smi_totals() -> list[int]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    totals = [int(float(line)) << 20 for line in out.split() if line.strip()]
    return [totals[i] for i in _visible(len(totals))]


def detect_gpu_bytes() -> int | None:
    """The smallest visible GPU's memory in bytes, or None when the driver machine has no GPU."""
    totals = _nvml_totals()
    if totals is None:
        totals = _smi_totals()
    return min(totals) if totals else None
