"""Load a recipe's hydra config (`trainer/config/recipe/<name>.yaml`), checking its own sections too."""

from __future__ import annotations

import re
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from trainer.config_loader import ConfigError, load_config
from trainer.override_keys import valid_keys_near
from workers.rl_math.dpo import DPO_LOSS_TYPES


def validate_dpo(section: DictConfig) -> None:
    problems = []
    if not isinstance(section.beta, (int, float)) or section.beta <= 0:
        problems.append(f"dpo.beta={section.beta!r} must be a number > 0")
    if section.loss_type not in DPO_LOSS_TYPES:
        problems.append(f"dpo.loss_type={section.loss_type!r} is not valid; choose one of {list(DPO_LOSS_TYPES)}")
    if not isinstance(section.label_smoothing, (int, float)) or not 0 <= section.label_smoothing < 0.5:
        problems.append(f"dpo.label_smoothing={section.label_smoothing!r} must be in [0, 0.5)")
    elif section.label_smoothing and section.loss_type != "sigmoid":
        problems.append("dpo.label_smoothing applies to dpo.loss_type=sigmoid only")
    if section.normalize_by not in ("prompts", "pairs"):
        problems.append(f"dpo.normalize_by={section.normalize_by!r} is not valid; choose one of ['prompts', 'pairs']")
    if isinstance(section.epochs, bool) or not isinstance(section.epochs, int) or section.epochs < 1:
        problems.append(f"dpo.epochs={section.epochs!r} must be a positive integer")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def load_recipe_config(name: str, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose `recipe/<name>` with hydra overrides; unknown keys list the recipe's valid keys."""
    config_name = f"recipe/{name}"
    try:
        cfg = load_config(overrides, config_name=config_name)
    except ConfigError as error:
        # The trainer's loader lists keys of the trainer config; recipe sections (dpo.*) need the recipe's.
        key = re.match(r"unknown config key '([^']+)'", str(error))
        if key is None:
            raise
        first_line = str(error).splitlines()[0]
        raise ConfigError(
            f"{first_line}\n{valid_keys_near(load_config([], config_name=config_name), key.group(1))}"
        ) from None
    if "dpo" in cfg:
        validate_dpo(cfg.dpo)
    return cfg


def as_dict(section: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
