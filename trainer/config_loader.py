"""Load the trainer's hydra config from command-line overrides, with errors that list what is valid."""

from __future__ import annotations

import re
from typing import Any, Sequence

from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from trainer import run_setup
from trainer.algorithm_settings import check_algorithm_settings
from trainer.cuda_alloc import alloc_conf_problem
from trainer.rollout_settings import check_rollout_settings
from trainer.trackers.spec import entry_problem
from workers.cached_blocks_limit import RELEASE_POINTS
from workers.rl_math.names import KL_PENALTY_NAMES, LOSS_AGG_MODES, OLD_LOG_PROB_PASS_CHOICES, POLICY_LOSS_MODES

CONFIG_MODULE = "trainer.config"
CONFIG_NAME = "trainer"


class ConfigError(ValueError):
    """A bad override or value; the message names it and lists the valid choices."""


# Settings that had two names; the old one fails with the name to use.
RENAMED = {
    "algorithm.rollout_n": "actor_rollout_ref.rollout.n",
    "algorithm.use_kl_loss": "actor_rollout_ref.actor.use_kl_loss",
}


def _base_config(config_name: str = CONFIG_NAME) -> DictConfig:
    with initialize_config_module(CONFIG_MODULE, version_base=None):
        return compose(config_name)


def _valid_keys_near(path: str, config_name: str = CONFIG_NAME) -> str:
    """The keys that exist at the deepest existing level of a dotted `path`."""
    node: Any = _base_config(config_name)
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


def _explain(error: Exception, config_name: str) -> str:
    text = str(error)
    cause = str(error.__cause__) if error.__cause__ else ""
    key = re.search(r"Could not override '([^']+)'", text)
    if key:
        reason = cause.splitlines()[0] if cause else text.splitlines()[0]
        return f"unknown config key '{key.group(1)}' ({reason})\n" + _valid_keys_near(key.group(1), config_name)
    merging = re.search(r"Error merging override (\S+)", text)
    if merging and cause:  # a typed value that does not convert, e.g. raft.min_reward=hot
        return f"invalid configuration: {merging.group(1)}: {cause.splitlines()[0]}"
    return cause or text


def _override_key(override: str) -> tuple[str, bool]:
    """The dotted key of a hydra override and whether it adds a key (`+key=...` / `++key=...`)."""
    key = override.split("=", 1)[0]
    return key.lstrip("+~"), key.startswith("+")


def _check_renamed(overrides: Sequence[str]) -> None:
    for override in overrides:
        key, _ = _override_key(override)
        if key in RENAMED:
            value = override.split("=", 1)[1] if "=" in override else "..."
            raise ConfigError(f"'{key}' is now '{RENAMED[key]}' (one name per setting); use {RENAMED[key]}={value}")


def _check_additions(overrides: Sequence[str], config_name: str) -> None:
    """`+key=value` may only add keys that something reads: keys of the config (the trainer's or the
    recipe's) or worker settings that the YAML leaves at their defaults (workers/config.py)."""
    added = [key for key, adds in map(_override_key, overrides) if adds]
    if not added:
        return
    from workers.config import declared_worker_key  # loads torch: only when a key is added
    schema = _base_config(config_name)
    for key in added:
        if OmegaConf.select(schema, key, default=_MISSING) is not _MISSING or declared_worker_key(key):
            continue
        raise ConfigError(
            f"unknown config key '{key}' (a '+' override adds a key, but nothing reads this one)\n"
            + _valid_keys_near(key, config_name)
        )


_MISSING = object()
AUTO = "auto"


def load_config(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """Compose `trainer/config/<config_name>.yaml` (or a recipe's registered config) with hydra overrides
    (`a.b=c`, `algorithm=ppo`); unknown keys, renamed keys and bad values raise ConfigError."""
    overrides = list(overrides)
    _check_renamed(overrides)
    try:
        with initialize_config_module(CONFIG_MODULE, version_base=None):
            cfg = compose(config_name, overrides=overrides)
    except (ConfigCompositionException, MissingConfigException) as error:
        raise ConfigError(_explain(error, config_name)) from None
    _check_additions(overrides, config_name)
    OmegaConf.resolve(cfg)
    if isinstance(cfg.trainer.logger, str):  # `trainer.logger=console`: one backend by name
        cfg.trainer.logger = [cfg.trainer.logger]
    resolve_auto_values(cfg)
    validate_config(cfg)
    return cfg


def resolve_auto_values(cfg: DictConfig) -> None:
    """Replace the `auto` values that depend on this node by what they mean here, once, so that `--cfg job`,
    `trainer.plan_only`, the memory plan, the checks and the workers all read the same number."""
    trainer = cfg.trainer
    if trainer.get("n_gpus_per_node") == AUTO:
        # Through the module: tests replace run_setup.visible_gpu_count with a count of their own.
        trainer.n_gpus_per_node = run_setup.default_workers_per_node(str(trainer.get("device", "auto")))


_CHOICES = {
    "algorithm.adv_estimator": ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"),
    "algorithm.kl_penalty": KL_PENALTY_NAMES,
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG_MODES,
    "actor_rollout_ref.actor.policy_loss.loss_mode": POLICY_LOSS_MODES,
    "actor_rollout_ref.actor.optim.lr_scheduler": ("constant", "cosine"),
    "actor_rollout_ref.actor.old_log_prob_pass": OLD_LOG_PROB_PASS_CHOICES,
    "actor_rollout_ref.model.dtype": ("auto", "float32", "bfloat16", "float16"),
    "actor_rollout_ref.rollout.name": ("hf", "vllm"),
    "actor_rollout_ref.rollout.placement": ("hybrid", "separate"),
    "data.truncation": ("error", "left", "right", "filter"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.release_cached_blocks": RELEASE_POINTS,
    "trainer.placement": ("colocated", "separate"),
    "trainer.memory_check": ("error", "warn", "off"),
    "trainer.plan_only": (False, True),
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
# Positive integers that may also be `auto` (resolve_auto_values replaces it), and what auto means.
_AUTO_INTS = {
    "trainer.n_gpus_per_node": f"one worker per GPU this node shows, {run_setup.CPU_WORKERS_PER_NODE} CPU workers without a GPU",
}
# Keys that are null or a positive number of the given kind, and what null means.
_OPTIONAL_POSITIVE = {
    "trainer.call_timeout_s": ((int, float), "off"),
    "trainer.max_ckpt_to_keep": ((int,), "off"),
    "trainer.gpu_memory_gib": ((int, float), "read from the driver machine's GPU"),
    "trainer.device_peak_tflops": ((int, float), "the GPU's dense bf16 peak by its name"),
    "trainer.driver_threads": ((int,), "torch's default, one per core"),
}
# Keys that are a positive number of the given kind.
_POSITIVE_NUMBERS = {"trainer.ray_connect_timeout_s": (int, float)}


def _optional_positive(cfg: DictConfig, key: str, kind: tuple[type, ...], null_means: str) -> str:
    value = OmegaConf.select(cfg, key)
    if value is None or (isinstance(value, kind) and not isinstance(value, bool) and value > 0):
        return ""
    what = "integer" if kind == (int,) else "number"
    return f"{key}={value!r} must be null ({null_means}) or a positive {what}"


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
            auto = f" or auto ({_AUTO_INTS[key]})" if key in _AUTO_INTS else ""
            problems.append(f"{key}={value!r} must be a positive integer{auto}")
    problems.extend(_optional_positive(cfg, key, kind, null_means) for key, (kind, null_means) in _OPTIONAL_POSITIVE.items())
    for key, kind in _POSITIVE_NUMBERS.items():
        value = OmegaConf.select(cfg, key, default=1)
        if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
            problems.append(f"{key}={value!r} must be a positive number (seconds)")
    problems.append(alloc_conf_problem(cfg.trainer.get("cuda_alloc_conf")))
    problems.extend(check_rollout_settings(cfg))
    problems.extend(check_algorithm_settings(cfg))
    problems = [p for p in problems if p]
    problems.extend(problem for problem in map(entry_problem, cfg.trainer.logger) if problem)
    repeated = sorted({str(entry) for entry in cfg.trainer.logger if list(cfg.trainer.logger).count(entry) > 1})
    if repeated:
        problems.append(f"trainer.logger lists {repeated} more than once; each backend once")
    if not problems:
        prompts = cfg.data.train_batch_size
        mini = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        if prompts % mini:
            problems.append(
                f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} (prompts) must divide data.train_batch_size={prompts}"
            )
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))
