"""The command line, environment and output file of each side of the GPU comparison, and how one is run.

Each side runs in its own process with its own packages: verl with `/tmp/verl_site` (tensordict 0.10 and its
other wheels, benchmarks/peers/verl_bundle.sh) first on PYTHONPATH and the project's root off it, TRL with
`/tmp/trl_site` (trl, datasets, multiprocess) first, ours with neither.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.peers.gpu_memory import PeakGpuMemory, visible_devices
from benchmarks.peers.gpu_settings import GpuGRPO, ours_overrides
from benchmarks.peers.verl_settings import verl_overrides

VERL_SITE = "/tmp/verl_site"
TRL_SITE = "/tmp/trl_site"
# What compare.py reads from each side's output folder.
SIDE_FILES = {"ours_packed": "ours_packed_e2e.json", "ours_padded": "ours_padded_e2e.json", "verl": "verl_metrics.jsonl",
              "trl": "trl_gpu.json"}


@dataclass(frozen=True)
class Plan:
    """One invocation: where inputs and outputs live, how many steps, the shared settings, and whether this is
    the CPU dry run at the tiny size."""

    work: Path
    out: Path
    steps: int
    settings: GpuGRPO
    tiny: bool = False
    verl_extra: tuple[str, ...] = ()
    peak_tflops: float | None = None  # given: our sides' trainer.device_peak_tflops (else found by the GPU's name)
    ours_extra: tuple[str, ...] = ()  # more overrides of our sides

    @property
    def size(self) -> str:
        return self.settings.size

    @property
    def model(self) -> Path:
        return self.work / self.size / "model"

    @property
    def data(self) -> Path:
        return self.work / self.size / "data"


@dataclass
class SideCommand:
    side: str
    command: list[str]
    env: dict[str, str] = field(repr=False)
    output: Path
    log: Path


def base_env(gpus: int = 1) -> dict[str, str]:
    """The environment every side starts with: the first `gpus` devices unless CUDA_VISIBLE_DEVICES says which."""
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(gpus)))
    return dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", RAY_AUTH_MODE="disabled",
                VLLM_USE_FLASHINFER_SAMPLER="0", CUDA_VISIBLE_DEVICES=devices)


def _python_path(first: str, keep_cwd: bool) -> str:
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != first]
    if not keep_cwd:
        rest = [p for p in rest if Path(p).resolve() != Path.cwd()]
    return os.pathsep.join([first, *rest])


def side_command(side: str, plan: Plan) -> SideCommand:
    out, log = plan.out / SIDE_FILES[side], plan.out / f"{side}_log.txt"
    env = base_env(plan.settings.gpus)
    if side in ("ours_packed", "ours_padded"):
        # --reuse-model: the folder verl_gpu wrote once for every side (a 7B one takes 30-45 s to write).
        command = [sys.executable, "-m", "benchmarks.e2e_step", "--sizes", plan.size, "--steps", str(plan.steps),
                   "--workdir", str(plan.work), "--out", str(out), "--reuse-model", *(["--eager"] if plan.tiny else []),
                   *ours_overrides(plan.settings, side), f"trainer.default_local_dir={plan.work / side}",
                   *(["trainer.device=cpu"] if plan.tiny else []),
                   *([f"trainer.device_peak_tflops={plan.peak_tflops}"] if plan.peak_tflops else []), *plan.ours_extra]
        return SideCommand(side, command, env, out, log)
    if side == "verl":
        overrides = verl_overrides(plan.model, plan.data / "train.parquet", plan.data / "val.parquet", plan.work, plan.steps, plan.settings)
        # A fresh local Ray instance, never one that happens to be running already.
        command = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides, "+ray_kwargs.ray_init.address=local", *plan.verl_extra]
        # verl imports nothing of the toolkit: the project's root leaves its path (its tensordict differs).
        env = dict(env, PYTHONPATH=_python_path(VERL_SITE, keep_cwd=False), VERL_FILE_LOGGER_PATH=str(out))
        return SideCommand(side, command, env, out, log)
    if side == "trl":
        command = [sys.executable, "-m", "benchmarks.peers.trl_gpu", "--model", str(plan.model), "--train",
                   str(plan.data / "train.parquet"), "--out", str(out), "--steps", str(plan.steps), *(["--cpu"] if plan.tiny else [])]
        return SideCommand(side, command, dict(env, PYTHONPATH=_python_path(TRL_SITE, keep_cwd=True)), out, log)
    raise ValueError(f"unknown side {side!r}; the sides are ours_packed, ours_padded, verl, trl")


def run_side(side: SideCommand, timeout_s: float) -> dict[str, Any]:
    """Run `side` in its own process group with output to its log; kill the group at `timeout_s`. The Ray
    services a driver starts share its group and die with it, so nothing machine-wide such as `ray stop` is
    needed."""
    side.output.unlink(missing_ok=True)
    start = time.perf_counter()
    with open(side.log, "w") as log, PeakGpuMemory(devices=visible_devices(side.env)) as memory:
        process = subprocess.Popen(side.command, stdout=log, stderr=subprocess.STDOUT, env=side.env, start_new_session=True)
        try:
            code: int | str = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = "timeout"
    return {"command": side.command, "exit": code, "wall_s": time.perf_counter() - start, "timeout_s": timeout_s,
            "gpu_used_peak_gib": memory.peak_gib, "gpu_used_before_gib": memory.baseline_gib, "gpu_used_peak_gib_per_device": memory.peaks_gib}
