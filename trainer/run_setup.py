"""What every run needs before its loop: the default tiny model and data when absent, and a Ray cluster."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

DEFAULT_MODEL_PATH = "outputs/tiny_model"
DEFAULT_DATA_DIR = "outputs/data"


def ensure_default_assets(cfg: DictConfig) -> None:
    """Build the embedded tiny model and the synthetic data when the config points at their absent defaults."""
    if cfg.actor_rollout_ref.model.path == DEFAULT_MODEL_PATH and not Path(DEFAULT_MODEL_PATH, "config.json").exists():
        from trainer.tiny_model import build_tiny_model

        build_tiny_model(DEFAULT_MODEL_PATH, seed=cfg.trainer.seed)
    defaults = (f"{DEFAULT_DATA_DIR}/train.parquet", f"{DEFAULT_DATA_DIR}/val.parquet")
    if (cfg.data.train_files, cfg.data.val_files) == defaults and not all(Path(p).exists() for p in defaults):
        from trainer.datasets.synthetic import write_synthetic_dataset

        tasks = ("char_class", "arithmetic") if cfg.data.synthetic_tasks == "both" else (cfg.data.synthetic_tasks,)
        write_synthetic_dataset(DEFAULT_DATA_DIR, tasks=tasks, seed=cfg.data.seed)


def init_ray(cfg: DictConfig) -> None:
    """Attach to RAY_ADDRESS when set; otherwise start a local cluster bound to 127.0.0.1."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    from single_controller.ray.local_cluster import init_local_ray, prepend_pythonpath

    runtime_env = {"env_vars": {"PYTHONPATH": prepend_pythonpath(os.getcwd())}}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env)
        return

    workers = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    init_local_ray(num_cpus=cfg.trainer.ray_num_cpus or max(os.cpu_count() or 1, 2 * workers + 2), runtime_env=runtime_env)
