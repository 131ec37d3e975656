"""The GPU memory the plan is made for: what CUDA can allocate (NVML's total less the driver's reservation), the
total vLLM's gpu_memory_utilization multiplies; the whole total where the driver cannot say what it reserves."""

import os
from types import SimpleNamespace

from trainer.memory_plan.gpu import allocatable_bytes, detect_gpu_bytes

MIB = 1 << 20
H200_TOTAL, H200_RESERVED = 143_771 * MIB, 606 * MIB  # NVML's total; what CUDA reports is 139.81 GiB


class FakeNvml:
    """The two calls `allocatable_bytes` makes of the NVML bindings (nvidia-ml-py's names)."""

    nvmlMemory_v2 = 0x02000028

    def __init__(self, v2: bool):
        self.v2 = v2

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        if version is None:
            return SimpleNamespace(total=H200_TOTAL, free=H200_TOTAL - H200_RESERVED, used=H200_RESERVED)
        if not self.v2:
            raise RuntimeError("Function Not Found")  # pynvml's NVMLError_FunctionNotFound on an older driver
        return SimpleNamespace(version=version, total=H200_TOTAL, reserved=H200_RESERVED, free=H200_TOTAL - H200_RESERVED, used=0)


def test_the_plan_counts_what_cuda_can_allocate_not_nvmls_total():
    assert allocatable_bytes(FakeNvml(v2=True), handle=0) == H200_TOTAL - H200_RESERVED
    assert round((H200_TOTAL - H200_RESERVED) / (1 << 30), 2) == 139.81
    assert allocatable_bytes(FakeNvml(v2=False), handle=0) == H200_TOTAL


def fake_smi(folder, reserved_answer: str) -> None:
    tool = folder / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\ncase \"$1\" in\n"
        "  --query-gpu=memory.total) echo 143771; echo 81559 ;;\n"
        f"  --query-gpu=memory.reserved) {reserved_answer} ;;\n"
        "  *) exit 2 ;;\nesac\n"
    )
    tool.chmod(0o755)


def test_without_the_nvml_bindings_nvidia_smi_gives_the_total_less_the_reservation(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr("trainer.memory_plan.gpu._nvml_each", lambda read: None)
    fake_smi(tmp_path, "echo 606; echo 452")
    assert detect_gpu_bytes() == (143_771 - 606) * MIB
    fake_smi(tmp_path, "echo 'Field \"memory.reserved\" is not a valid field to query.' >&2; exit 2")  # an older driver
    assert detect_gpu_bytes() == 143_771 * MIB
    fake_smi(tmp_path, "echo '[N/A]'; echo '[N/A]'")
    assert detect_gpu_bytes() == 143_771 * MIB
