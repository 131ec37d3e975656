"""The driver machine's GPUs (memory, name), read through NVML (no CUDA context is created: the driver process
must not hold GPU memory for the whole run), or `nvidia-smi` where the NVML bindings are not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Callable

GIB = 1 << 30


def _visible(count: int) -> list[int]:
    """Indices of the devices CUDA_VISIBLE_DEVICES leaves visible (all when unset or given as UUIDs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    picked = [int(v) for v in visible.split(",") if v.strip().isdigit()]
    return [i for i in picked if i < count] if picked or not visible.strip() else list(range(count))


def _nvml_each(read: Callable[[Any, Any], Any]) -> list[Any] | None:
    """`read(pynvml, handle)` for each visible device; None without the NVML bindings, [] without a device."""
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
        return [read(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in _visible(count)]
    finally:
        pynvml.nvmlShutdown()


def _smi_each(field: str) -> list[str]:
    """`nvidia-smi --query-gpu=<field>` for each visible device; [] without the tool or a device."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    values = [line.strip() for line in out.splitlines() if line.strip()]
    return [values[i] for i in _visible(len(values))]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # older NVML bindings return bytes


def detect_gpu_count() -> int:
    """How many GPUs this node shows (CUDA_VISIBLE_DEVICES applied); 0 without a GPU."""
    handles = _nvml_each(lambda nvml, handle: handle)
    return len(handles) if handles is not None else len(_smi_each("index"))


def allocatable_bytes(nvml: Any, handle: Any) -> int:
    """What CUDA can allocate on the device: NVML's total less what the driver and firmware reserve (NVML's v2
    memory query). CUDA's total (cudaMemGetInfo), which vLLM multiplies by gpu_memory_utilization, leaves that
    reservation out: on an H200 vLLM's start-up figures close with 139.8 GiB where NVML's total is 140.4
    (docs/benchmarks.md). The whole total where the driver predates the v2 query."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        return int(info.total) - int(info.reserved)
    except Exception:  # noqa: BLE001 - NVMLError_FunctionNotFound and friends on older drivers
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)


def _smi_mib(field: str) -> list[int]:
    """`nvidia-smi`'s figure in MiB for each visible device, in bytes; [] where any is not a number ("[N/A]")."""
    try:
        return [int(float(value)) << 20 for value in _smi_each(field)]
    except ValueError:
        return []


def _smi_allocatable_bytes() -> list[int]:
    totals, reserved = _smi_mib("memory.total"), _smi_mib("memory.reserved")  # reserved: [] on older drivers
    return [t - r for t, r in zip(totals, reserved)] if len(reserved) == len(totals) else totals


def detect_gpu_bytes() -> int | None:
    """The smallest visible GPU's memory CUDA can allocate, in bytes (`allocatable_bytes`), or None when the driver
    machine has no GPU."""
    totals = _nvml_each(allocatable_bytes)
    if totals is None:
        totals = _smi_allocatable_bytes()
    return min(totals) if totals else None


def detect_gpu_name() -> str | None:
    """The first visible GPU's name as the driver reports it (e.g. "NVIDIA H100 80GB HBM3"), or None."""
    names = _nvml_each(lambda nvml, handle: _text(nvml.nvmlDeviceGetName(handle)))
    if names is None:
        names = _smi_each("name")
    return names[0] if names else None
