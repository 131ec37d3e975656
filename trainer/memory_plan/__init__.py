"""A per-GPU memory plan of a run, computed from its config and the models' config.json before Ray starts
(no torch): `python -m trainer.main ... trainer.plan_only=true` prints it; every GPU run checks it
(`trainer.memory_check`). docs/operations.md explains how to read it and what it leaves out."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from trainer.memory_plan.checks import plan_notes, startup_problems
from trainer.memory_plan.gpu import GIB, detect_gpu_bytes
from trainer.memory_plan.plan import COLUMNS, GpuGroup, MemoryPlan, Row, build_groups
from trainer.memory_plan.report import (
    CRITIC_OPTIMIZER_OFFLOAD,
    CRITIC_PARAM_OFFLOAD,
    LORA,
    LOWER_UTILIZATION,
    OPTIMIZER_OFFLOAD,
    PARAM_OFFLOAD,
    SMALLER_KV_CACHE,
    misfit_message,
    render_plan,
    summary_line,
)
from trainer.memory_plan.setup import PlanSetup, plan_setup

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
        settings_on=_settings_on(setup),
    )


def _settings_on(setup: PlanSetup) -> set[str]:
    """The remedies not to suggest: settings the run already has, and the engine setting that does not size its
    share (with a fixed KV cache the utilization only gates the start; without one there is no cache size)."""
    actor = setup.actor
    on = {PARAM_OFFLOAD} if actor.param_offload else set()
    on |= {OPTIMIZER_OFFLOAD} if actor.optimizer_offload else set()
    # The critic's switches: not suggested without a critic that could move its state (FSDP, on a GPU), or when on.
    critic = setup.critic
    movable = critic is not None and critic.strategy == "fsdp" and setup.on_gpu
    on |= {CRITIC_PARAM_OFFLOAD} if not movable or critic.param_offload else set()
    on |= {CRITIC_OPTIMIZER_OFFLOAD} if not movable or critic.optimizer_offload else set()
    on |= {LOWER_UTILIZATION} if setup.rollout.kv_cache_bytes is not None else {SMALLER_KV_CACHE}
    return on | ({LORA} if actor.train is not None and actor.train.lora_rank else set())
