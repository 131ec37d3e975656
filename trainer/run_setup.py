"""What every run needs before its loop: the default tiny model and data when absent, and a Ray cluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig

from trainer.input_errors import InputError

DEFAULT_MODEL_PATH = "outputs/tiny_model"
DEFAULT_VLM_PATH = "outputs/tiny_vlm"  # the tiny vision-language model of task=visual_colors
DEFAULT_MOE_PATH = "outputs/tiny_moe"  # the tiny mixture-of-experts model (trainer/tiny_moe.py)
DEFAULT_DATA_DIR = "outputs/data"
DEFAULT_CONNECT_TIMEOUT_S = 30  # trainer.ray_connect_timeout_s of a config without it (a recipe's own)
DEFAULT_DRIVER_THREADS = 1  # trainer.driver_threads of a config without it
# trainer.n_gpus_per_node=auto where the run has no GPU: two CPU worker processes, the fewest that exercise the
# data-parallel path (FSDP over gloo) the README's default job runs; more would compete for the same cores.
CPU_WORKERS_PER_NODE = 2
DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")  # trainer.device
# trainer.placement: the trainer's roles share one pool (colocated) or each role gets its own (separate)
ROLE_PLACEMENTS: tuple[str, ...] = ("colocated", "separate")


def ensure_default_assets(cfg: DictConfig) -> None:
    """Build the embedded tiny model and the synthetic data when the config points at their absent defaults."""
    if cfg.actor_rollout_ref.model.path == DEFAULT_MODEL_PATH and not Path(DEFAULT_MODEL_PATH, "config.json").exists():
        from trainer.tiny_model import build_tiny_model

        build_tiny_model(DEFAULT_MODEL_PATH, seed=cfg.trainer.seed)
    if cfg.actor_rollout_ref.model.path == DEFAULT_VLM_PATH and not Path(DEFAULT_VLM_PATH, "config.json").exists():
        from trainer.tiny_vlm import build_tiny_vlm

        build_tiny_vlm(DEFAULT_VLM_PATH, seed=cfg.trainer.seed)
    if cfg.actor_rollout_ref.model.path == DEFAULT_MOE_PATH and not Path(DEFAULT_MOE_PATH, "config.json").exists():
        from trainer.tiny_moe import build_tiny_moe

        build_tiny_moe(DEFAULT_MOE_PATH, seed=cfg.trainer.seed)
    # The default folder, or another outputs/data* folder a task config names (task=tool_vault).
    data_dir = str(Path(str(cfg.data.train_files)).parent)
    defaults = (f"{data_dir}/train.parquet", f"{data_dir}/val.parquet")
    synthetic = data_dir.startswith(DEFAULT_DATA_DIR) and (cfg.data.train_files, cfg.data.val_files) == defaults
    if synthetic and not all(Path(p).exists() for p in defaults):
        from trainer.datasets.synthetic import write_synthetic_dataset

        tasks = ("char_class", "arithmetic") if cfg.data.synthetic_tasks == "both" else (cfg.data.synthetic_tasks,)
        write_synthetic_dataset(data_dir, tasks=tasks, seed=cfg.data.seed)


@contextmanager
def driver_threads(cfg: DictConfig) -> Iterator[None]:
    """Torch's CPU threads in this (the driver) process while the run lasts: `trainer.driver_threads`, null
    keeping torch's default; the count before is restored after.

    The driver's tensor work is bookkeeping (indexing, concatenating, masks) and small batch math. With torch's
    default of one thread per core, every such op on a 64-core node starts a parallel region whose threads spin
    on cores the workers need: filing a 16-group async batch took 0.8 s there, at 50 cores busy."""
    threads = cfg.trainer.get("driver_threads", DEFAULT_DRIVER_THREADS)
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def visible_gpu_count() -> int:
    """The GPUs this node shows (CUDA_VISIBLE_DEVICES applied), read the way the memory plan reads their size
    (trainer/memory_plan/gpu.py: NVML, else nvidia-smi): no torch import and no CUDA context in the driver."""
    from trainer.memory_plan.gpu import detect_gpu_count

    return detect_gpu_count()


def runs_on_gpu(device: str, gpus_shown: int) -> bool:
    """Whether the run's workers take GPUs, as the driver decides it before torch loads (trainer.device)."""
    return device == "cuda" or (device == "auto" and gpus_shown > 0)


def default_workers_per_node(device: str) -> int:
    """trainer.n_gpus_per_node=auto: one worker per GPU this node shows, CPU_WORKERS_PER_NODE without a GPU
    (or with trainer.device=cpu). The one place `auto` is resolved; config_loader calls it."""
    if device == "cpu":
        return CPU_WORKERS_PER_NODE  # no GPU query: a CPU run never needs one
    # trainer.device=cuda on a node that shows none (a driver attaching to GPU nodes): 2, as before `auto`.
    return visible_gpu_count() or CPU_WORKERS_PER_NODE


def ray_address() -> str | None:
    """The cluster the run attaches to (RAY_ADDRESS), or None: init_ray starts a local one on this node."""
    return os.environ.get("RAY_ADDRESS") or None


def ray_running_here() -> bool:
    """Whether this process already has Ray (a notebook, a test session): init_ray then starts and attaches
    nothing, and the run uses that cluster. Read without importing Ray."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def init_ray(cfg: DictConfig) -> None:
    """Attach to RAY_ADDRESS when set (giving up after trainer.ray_connect_timeout_s when nothing answers);
    otherwise start a local cluster bound to 127.0.0.1."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray_running_here():
        return
    from single_controller.ray.attach import ClusterUnreachable, attach
    from single_controller.ray.local_cluster import init_local_ray, prepend_pythonpath

    runtime_env = {"env_vars": {"PYTHONPATH": prepend_pythonpath(os.getcwd())}}
    address = ray_address()
    if address:
        try:
            timeout_s = cfg.trainer.get("ray_connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S)
            attach(address, timeout_s, runtime_env=runtime_env)
        except ClusterUnreachable as error:
            raise InputError(str(error)) from None
        from single_controller.ray.shared_session import check_working_dir

        problem = check_working_dir()
        if problem:
            raise InputError(problem)
        settle_device_on_cluster(cfg)
        return

    workers = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    init_local_ray(
        num_cpus=cfg.trainer.ray_num_cpus or max(os.cpu_count() or 1, 2 * workers + 2), runtime_env=runtime_env
    )


def settle_device_on_cluster(cfg: DictConfig) -> None:
    """trainer.device=auto on a driver attached to a cluster: the workers take GPUs when the cluster has any,
    whatever the driver's own node shows. The driver often runs where no GPU is visible (a CPU-only head node,
    or `ray job submit` with entrypoint resources, which hides the head's GPUs from the job): deciding by that
    node would put CPU workers on the GPU nodes."""
    if cfg.trainer.device != "auto":
        return
    import ray

    cfg.trainer.device = "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
