"""A per-GPU memory plan of a run, computed from its config and the models' config.json before Ray starts
(no torch): `python -m trainer.main ... trainer.plan_only=true` prints it; every GPU run checks it
(`trainer.memory_check`). docs/operations.md explains how to read it and what it leaves out."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from trainer.memory_plan.checks import plan_notes, startup_problems
from trainer.memory_plan.engine_concurrency import concurrency_warnings
from trainer.memory_plan.gpu import GIB, detect_gpu_bytes
from trainer.memory_plan.plan import COLUMNS, GpuGroup, MemoryPlan, Row, build_groups
from trainer.memory_plan.report import misfit_message, render_plan, settings_on, summary_line
from trainer.memory_plan.setup import plan_setup

__all__ = [
    "COLUMNS", "GpuGroup", "MemoryPlan", "Row", "build_plan", "gpu_memory", "misfit_message", "render_plan",
    "summary_line",
]


def gpu_memory(cfg: DictConfig) -> tuple[int | None, str]:
    """(bytes per GPU, where the figure comes from): `trainer.gpu_memory_gib` when set (planning for another
    machine), else the driver machine's GPU read through NVML, else unknown."""
    setting = OmegaConf.select(cfg, "trainer.gpu_memory_gib", default=None)
    if setting is not None:
        return int(float(setting) * GIB), "trainer.gpu_memory_gib"
    if OmegaConf.select(cfg, "trainer.device", default="auto") == "cpu":
        return None, "trainer.device=cpu"
    detected = detect_gpu_bytes()
    if detected is None:
        return None, "no GPU on this machine; set trainer.gpu_memory_gib"
    return detected, "detected on this machine"


def build_plan(cfg: DictConfig, gpu_bytes: int | None = None, gpu_source: str = "given") -> MemoryPlan:
    """The plan of `cfg` for GPUs of `gpu_bytes` (None: unknown). Computed for GPUs (bf16 for dtype auto)
    unless trainer.device=cpu. ValueError names a model folder without a usable config.json."""
    on_gpu = OmegaConf.select(cfg, "trainer.device", default="auto") != "cpu"
    setup = plan_setup(cfg, on_gpu)
    return MemoryPlan(
        groups=build_groups(setup, gpu_bytes), gpu_bytes=gpu_bytes, gpu_source=gpu_source,
        problems=startup_problems(setup, gpu_bytes), notes=plan_notes(setup, gpu_bytes),
        warnings=concurrency_warnings(setup, gpu_bytes),
        settings_on=settings_on(setup),
    )
