"""Load the trainer's hydra config from command-line overrides, with errors that list what is valid."""

from __future__ import annotations

import re
from typing import Any, Sequence

from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from trainer.rollout_settings import check_rollout_settings

CONFIG_MODULE = "trainer.config"
CONFIG_NAME = "trainer"


class ConfigError(ValueError):
    """A bad override or value; the message names it and lists the valid choices."""


def _base_config() -> DictConfig:
    with initialize_config_module(CONFIG_MODULE, version_base=None):
        return compose(CONFIG_NAME)


def _valid_keys_near(path: str) -> str:
    """The keys that exist at the deepest existing level of a dotted `path`."""
    node: Any = _base_config()
    parts = path.split(".")
    walked = []
    for part in parts:
        if isinstance(node, DictConfig) and part in node:
            node, walked = node[part], walked + [part]
        else:
            break
    where = ".".join(walked) or "the top level"
    keys = sorted(node.keys()) if isinstance(node, DictConfig) else []
    return f"valid keys under {where}: {keys}"


def _explain(error: Exception) -> str:
    text = str(error)
    cause = str(error.__cause__) if error.__cause__ else ""
    key = re.search(r"Could not override '([^']+)'", text)
    if key:
        return f"unknown config key '{key.group(1)}' ({cause.splitlines()[0] if cause else text.splitlines()[0]})\n" + _valid_keys_near(key.group(1))
    return cause or text


def load_config(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """Compose `trainer/config/<config_name>.yaml` with hydra overrides (`a.b=c`, `algorithm=ppo`)."""
    try:
        with initialize_config_module(CONFIG_MODULE, version_base=None):
            cfg = compose(config_name, overrides=list(overrides))
    except (ConfigCompositionException, MissingConfigException) as error:
        raise ConfigError(_explain(error)) from None
    OmegaConf.resolve(cfg)
    validate_config(cfg)
    return cfg


_CHOICES = {
    "algorithm.adv_estimator": ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"),
    "algorithm.kl_penalty": ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "actor_rollout_ref.actor.loss_agg_mode": ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"),
    "actor_rollout_ref.actor.optim.lr_scheduler": ("constant", "cosine"),
    "actor_rollout_ref.model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "actor_rollout_ref.rollout.name": ("hf", "vllm"),
    "actor_rollout_ref.rollout.placement": ("hybrid", "separate"),
    "data.truncation": ("error", "left", "right", "filter"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.placement": ("colocated", "separate"),
}
_POSITIVE_INTS = (
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "trainer.total_training_steps",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
)
_LOGGERS = ("console", "jsonl", "tensorboard")
# Keys that are null (off) or a positive number of the given kind.
_OPTIONAL_POSITIVE = {"trainer.call_timeout_s": (int, float), "trainer.max_ckpt_to_keep": (int,)}


def _optional_positive(cfg: DictConfig, key: str, kind: tuple[type, ...]) -> str:
    value = OmegaConf.select(cfg, key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool) and value > 0):
        return ""
    what = "integer" if kind == (int,) else "number"
    return f"{key}={value!r} must be null (off) or a positive {what}"


def validate_config(cfg: DictConfig) -> None:
    """Check values the YAML schema cannot: choices, positive sizes, batch divisibility."""
    problems = []
    for key, choices in _CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in choices:
            problems.append(f"{key}={value!r} is not valid; choose one of {list(choices)}")
    for key in _POSITIVE_INTS:
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{key}={value!r} must be a positive integer")
    problems.extend(_optional_positive(cfg, key, kind) for key, kind in _OPTIONAL_POSITIVE.items())
    problems.extend(check_rollout_settings(cfg))
    problems = [p for p in problems if p]
    bad_loggers = [name for name in cfg.trainer.logger if name not in _LOGGERS]
    if bad_loggers:
        problems.append(f"trainer.logger has unknown entries {bad_loggers}; valid are {list(_LOGGERS)}")
    if not problems:
        prompts = cfg.data.train_batch_size
        mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        if prompts % mini:
            problems.append(
                f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} (prompts) must divide data.train_batch_size={prompts}"
            )
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
