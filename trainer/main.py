"""`python -m trainer.main [overrides...]`: PPO-family RL post-training of a Hugging Face causal LM.

With no arguments it builds the embedded tiny model and the synthetic task if they are missing and runs
GRPO on CPU. `--cfg job` prints the resolved configuration and exits. Overrides are hydra syntax:
`algorithm=ppo`, `actor_rollout_ref.actor.optim.lr=1e-3`, `trainer.total_training_steps=10`.
`recipe=<name>` (online_dpo, raft) or `recipe=path/to/my_recipe.py` (or a folder holding `<folder name>.py`)
runs that recipe (docs/recipes.md) with the remaining overrides instead; `--help` prints the usage.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from omegaconf import DictConfig

from trainer.cli import run_cli
from trainer.config_loader import load_config
from trainer.run_setup import DEFAULT_DATA_DIR, DEFAULT_MODEL_PATH, ensure_default_assets, init_ray

__all__ = ["DEFAULT_DATA_DIR", "DEFAULT_MODEL_PATH", "ensure_default_assets", "init_ray", "main", "run"]


def _build_roles(cfg: DictConfig) -> Any:
    from trainer.role_groups import RoleGroups

    return RoleGroups.build(cfg)


def _make_trainer(*args: Any) -> Any:
    from trainer.ppo_trainer import PPOTrainer

    return PPOTrainer(*args)


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Train the configured PPO-family algorithm; returns the metric history. The worker and trainer
    modules (torch, Ray) load only after the input checks, so a bad path fails in about a second."""
    from trainer.launch import run_loop

    return run_loop(cfg, _build_roles, _make_trainer)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    recipe = next((a for a in args if a.startswith("recipe=")), None)
    if recipe is not None:  # `recipe=<name or path>`: hand the other arguments to that recipe
        from trainer.recipe_runner import find_recipe, recipe_main

        try:
            module = find_recipe(recipe.split("=", 1)[1])
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        rest = [a for a in args if a != recipe]
        # A recipe with its own `main(argv)` parses its arguments itself; others get the standard command line.
        return module.main(rest) if callable(getattr(module, "main", None)) else recipe_main(module, rest)
    from trainer.recipe_runner import BUILT_IN_RECIPES  # only their names, for --help

    return run_cli(args, load_config, run, recipes=sorted(BUILT_IN_RECIPES))


if __name__ == "__main__":
    sys.exit(main())
