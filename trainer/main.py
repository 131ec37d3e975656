"""`python -m trainer.main [overrides...]`: PPO-family RL post-training of a Hugging Face causal LM.

With no arguments it builds the embedded tiny model and the synthetic task if they are missing and runs
GRPO on CPU. `--cfg job` prints the resolved configuration and exits. Overrides are hydra syntax:
`algorithm=ppo`, `actor_rollout_ref.actor.optim.lr=1e-3`, `trainer.total_training_steps=10`.
`recipe=online_dpo` runs that recipe (recipes/, docs/recipes.md) with the remaining overrides instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig

from trainer.cli import run_cli
from trainer.config_loader import load_config

DEFAULT_MODEL_PATH = "outputs/tiny_model"
DEFAULT_DATA_DIR = "outputs/data"


def ensure_default_assets(cfg: DictConfig) -> None:
    """Build the embedded tiny model and the synthetic data when the config points at their absent defaults."""
    if cfg.actor_rollout_ref.model.path == DEFAULT_MODEL_PATH and not Path(DEFAULT_MODEL_PATH, "config.json").exists():
        from trainer.tiny_model import build_tiny_model

        build_tiny_model(DEFAULT_MODEL_PATH, seed=cfg.trainer.seed)
    # The default folder, or another outputs/data* folder a task config names (task=tool_vault).
    data_dir = str(Path(str(cfg.data.train_files)).parent)
    defaults = (f"{data_dir}/train.parquet", f"{data_dir}/val.parquet")
    synthetic = data_dir.startswith(DEFAULT_DATA_DIR) and (cfg.data.train_files, cfg.data.val_files) == defaults
    if synthetic and not all(Path(p).exists() for p in defaults):
        from trainer.datasets.synthetic import write_synthetic_dataset

        tasks = ("char_class", "arithmetic") if cfg.data.synthetic_tasks == "both" else (cfg.data.synthetic_tasks,)
        write_synthetic_dataset(data_dir, tasks=tasks, seed=cfg.data.seed)


def init_ray(cfg: DictConfig) -> None:
    """Attach to RAY_ADDRESS when set; otherwise start a local cluster bound to 127.0.0.1."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}}
    if os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env=runtime_env)
        return
    from single_controller.ray.local_cluster import init_local_ray

    workers = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    init_local_ray(num_cpus=cfg.trainer.ray_num_cpus or max(os.cpu_count() or 1, 2 * workers + 2), runtime_env=runtime_env)


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Train the configured PPO-family algorithm; returns the metric history."""
    from trainer.launch import run_loop
    from trainer.ppo_trainer import PPOTrainer
    from trainer.role_groups import RoleGroups

    return run_loop(cfg, RoleGroups.build, PPOTrainer)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    recipe = next((a for a in args if a.startswith("recipe=")), None)
    if recipe is not None:  # `recipe=<name>`: hand the other arguments to that recipe's own main
        from recipes import recipe_main

        try:
            recipe_run = recipe_main(recipe.split("=", 1)[1])
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return recipe_run([a for a in args if a != recipe])
    return run_cli(args, load_config, run)


if __name__ == "__main__":
    sys.exit(main())
