"""Load the trainer's hydra config from command-line overrides, with errors that list what is valid."""

from __future__ import annotations

import re
import sys
from typing import Any, Sequence

from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf

from trainer import run_setup
from trainer.algorithm_names import ADVANTAGE_ESTIMATOR_NAMES, ESTIMATOR_GROUPS, KL_CONTROLLER_KINDS
from trainer.algorithm_settings import check_algorithm_settings
from trainer.checkpoint_contents import checkpoint_contents_notes, checkpoint_contents_problems
from trainer.config_source import (
    ConfigSource,
    ConfigSourceError,
    compose_source,
    config_groups,
    drop_keys,
    find_source,
    leaf_entries,
    read_user_file,
    split_config_flags,
)
from trainer.cuda_alloc import alloc_conf_problem
from trainer.data_names import TRUNCATION_MODES
from trainer.fsdp_settings import fsdp_size_problems
from trainer.node_policy import ON_NODE_JOIN_CHOICES, ON_NODE_LOSS_CHOICES, node_policy_problem
from trainer.override_keys import override_parts, review_keys, valid_keys_near
from trainer.preflight import MEMORY_CHECK_MODES
from trainer.reward_settings import REWARD_MANAGERS, declared_reward_kwarg
from trainer.rollout_settings import check_rollout_settings
from trainer.trackers.spec import entry_problem
from trainer.worker_sections import worker_value_problems
from workers.cached_blocks_limit import RELEASE_POINTS
from workers.rl_math.names import KL_PENALTY_NAMES

CONFIG_NAME = "trainer"


class ConfigError(ValueError):
    """A bad override or value; the message names it and lists the valid choices."""


# Settings that had two names; the old one fails with the name to use.
RENAMED = {
    "algorithm.rollout_n": "actor_rollout_ref.rollout.n",
    "algorithm.use_kl_loss": "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.optim.warmup_steps": "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "critic.optim.warmup_steps": "critic.optim.lr_warmup_steps",
    "actor_rollout_ref.actor.optim.lr_scheduler": "actor_rollout_ref.actor.optim.lr_scheduler_type",
    "critic.optim.lr_scheduler": "critic.optim.lr_scheduler_type",
    # Sections that took verl's names (a key below one moves with it).
    "actor_rollout_ref.actor.fsdp": "actor_rollout_ref.actor.fsdp_config",
    "actor_rollout_ref.ref.fsdp": "actor_rollout_ref.ref.fsdp_config",
    "reward.custom_function": "custom_reward_function",
    "reward.overlong_buffer": "reward_model.overlong_buffer",
    "reward.reward_model": "reward_model",
}


def renamed_key(key: str) -> str | None:
    """The key's new name when it, or a section above it, was renamed."""
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return None


def _explain(error: Exception, base: DictConfig) -> str:
    """One line for what hydra still refused after the key checks (a value that does not convert, say)."""
    text = str(error)
    cause = str(error.__cause__) if error.__cause__ else ""
    key = re.search(r"Could not override '([^']+)'", text)
    if key:
        reason = cause.splitlines()[0] if cause else text.splitlines()[0]
        return f"unknown config key '{key.group(1)}' ({reason})\n" + valid_keys_near(base, key.group(1))
    merging = re.search(r"Error merging override (\S+)", text)
    if merging and cause:  # a typed value that does not convert, e.g. raft.min_reward=hot
        return f"invalid configuration: {merging.group(1)}: {cause.splitlines()[0]}"
    return cause or text


def _check_renamed(keys: Sequence[tuple[str, str | None]]) -> list[str]:
    problems = []
    for key, value in keys:
        new = renamed_key(key)
        if new is not None:
            problems.append(f"'{key}' is now '{new}' (one name per setting); use {new}={value or '...'}")
    return problems


def _estimator_group(overrides: Sequence[str], groups: set[str], data: dict[str, Any] | None) -> list[str]:
    """`algorithm=<group>` for a command that names `algorithm.adv_estimator` but no algorithm group, so that
    the estimator's defaults come with it (verl scripts: `algorithm.adv_estimator=gae`, no group)."""
    if "algorithm" not in groups or any(override_parts(o)[0] == "algorithm" for o in overrides):
        return []
    named = [value for key, value, _ in map(override_parts, overrides) if key == "algorithm.adv_estimator"]
    if not named and data is not None:
        named = [str(OmegaConf.select(OmegaConf.create(data), "algorithm.adv_estimator", default=None) or "")]
    group = ESTIMATOR_GROUPS.get((named[-1] if named else "").strip("'\""))
    return [f"algorithm={group}"] if group else []


AUTO = "auto"


def _compose_fast(
    source: ConfigSource,
    selections: list[str],
    settings: list[str],
    defaults: list[Any] | None,
    data: dict[str, Any] | None,
) -> tuple[DictConfig, bool]:
    """The config the command's keys are checked against, and whether it holds all of them. Most commands only
    set existing keys: composing with all of them at once then gives the final config too, in one composition."""
    if not any("+" in override_parts(o)[2] for o in settings):
        try:
            return compose_source(source, selections + settings, defaults, data), True
        except (ConfigCompositionException, MissingConfigException):
            pass  # some key is unknown: check each against the config without the command's keys
    return compose_source(source, selections, defaults, data), False


def load_config(overrides: Sequence[str] = (), config_name: str = CONFIG_NAME) -> DictConfig:
    """Compose `trainer/config/<config_name>.yaml` (or a recipe's registered config, or the user's yaml named by
    `--config-path` / `--config-name` among the overrides) with hydra overrides (`a.b=c`, `algorithm=ppo`).
    Every unknown, renamed or refused key of the command is reported at once in one ConfigError; verl's speed
    hints with nothing to change here are printed once as notes."""
    try:
        args, config_path, named = split_config_flags(overrides)
        source = find_source(config_path, named or config_name, from_flag=named is not None)
        defaults, data = read_user_file(source.user_file) if source.user_file else (None, None)
    except ConfigSourceError as error:
        raise ConfigError(str(error)) from None
    groups = config_groups(source)
    selections = [o for o in args if override_parts(o)[0] in groups or override_parts(o)[0].startswith("hydra.")]
    selections += _estimator_group(selections + args, groups, data)
    settings = [o for o in args if o not in selections]
    problems = _check_renamed([override_parts(o)[:2] for o in settings])
    settings = [o for o in settings if renamed_key(override_parts(o)[0]) is None]
    notes: list[str] = []
    try:
        if data is not None:
            user_base = compose_source(source, selections, defaults, {})
            entries = [(k, str(v).lower() if isinstance(v, bool) else str(v), "", k) for k, v in leaf_entries(data)]
            problems += _check_renamed([(k, v) for k, v, _, _ in entries])
            entries = [entry for entry in entries if renamed_key(entry[0]) is None]
            in_file = review_keys(entries, user_base, declared_reward_kwarg, where=f"in {source.user_file.name}")
            problems += in_file.problems
            notes += in_file.notes
            data = drop_keys(data, [k for k, *_ in entries if k not in in_file.kept])
        base, whole = _compose_fast(source, selections, settings, defaults, data)
        review = review_keys(((*override_parts(o), o) for o in settings), base, declared_reward_kwarg)
        problems += review.problems
        notes += review.notes
        if problems:
            many = f"{len(problems)} settings of this command are not valid here:\n  " if len(problems) > 1 else ""
            raise ConfigError(many + "\n  ".join(problems))
        cfg = (
            base
            if whole and review.kept == settings
            else compose_source(source, selections + review.kept, defaults, data)
        )
    except (ConfigCompositionException, MissingConfigException) as error:
        raise ConfigError(_explain(error, compose_source(find_source(None, CONFIG_NAME), ()))) from None
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    OmegaConf.resolve(cfg)
    if isinstance(cfg.trainer.logger, str):  # `trainer.logger=console`: one backend by name
        cfg.trainer.logger = [cfg.trainer.logger]
    resolve_auto_values(cfg)
    validate_config(cfg)
    for note in checkpoint_contents_notes(cfg):
        print(f"note: {note}", file=sys.stderr)
    return cfg


def resolve_auto_values(cfg: DictConfig) -> None:
    """Replace the `auto` values that depend on this node by what they mean here, once, so that `--cfg job`,
    `trainer.plan_only`, the memory plan, the checks and the workers all read the same number."""
    trainer = cfg.trainer
    if trainer.get("n_gpus_per_node") == AUTO:
        # Through the module: tests replace run_setup.visible_gpu_count with a count of their own.
        trainer.n_gpus_per_node = run_setup.default_workers_per_node(str(trainer.get("device", "auto")))


_CHOICES = {
    "algorithm.adv_estimator": ADVANTAGE_ESTIMATOR_NAMES,
    "algorithm.kl_penalty": KL_PENALTY_NAMES,
    "algorithm.kl_ctrl.type": KL_CONTROLLER_KINDS,
    "reward_model.reward_manager": tuple(REWARD_MANAGERS),
    "data.truncation": TRUNCATION_MODES,
    "data.filter_overlong_prompts": (False, True),
    "data.return_raw_chat": (False, True),
    "trainer.device": run_setup.DEVICE_CHOICES,
    "trainer.release_cached_blocks": RELEASE_POINTS,
    "trainer.placement": run_setup.ROLE_PLACEMENTS,
    "trainer.on_node_loss": ON_NODE_LOSS_CHOICES,
    "trainer.on_node_join": ON_NODE_JOIN_CHOICES,
    "trainer.memory_check": MEMORY_CHECK_MODES,
    "trainer.plan_only": (False, True),
}
_POSITIVE_INTS = (
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "trainer.total_epochs",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
)
# Positive integers that may also be `auto` (resolve_auto_values replaces it), and what auto means.
_AUTO_INTS = {
    "trainer.n_gpus_per_node": (
        f"one worker per GPU this node shows, {run_setup.CPU_WORKERS_PER_NODE} CPU workers without a GPU"
    ),
}
# Keys that are null or a positive number of the given kind, and what null means.
_OPTIONAL_POSITIVE = {
    "trainer.total_training_steps": ((int,), "batches per epoch x trainer.total_epochs, trainer/step_count.py"),
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
    """Check every value: the worker sections by the workers' schema (workers/config_schema.py), the trainer's
    own keys here (choices, positive sizes), then the rules across keys (batch divisibility, ...)."""
    problems = worker_value_problems(cfg)
    for key, choices in _CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in choices:
            problems.append(f"{key}={value!r} is not valid; choose one of {list(choices)}")
    for key in _POSITIVE_INTS:
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            auto = f" or auto ({_AUTO_INTS[key]})" if key in _AUTO_INTS else ""
            problems.append(f"{key}={value!r} must be a positive integer{auto}")
    problems.extend(
        _optional_positive(cfg, key, kind, null_means) for key, (kind, null_means) in _OPTIONAL_POSITIVE.items()
    )
    for key, kind in _POSITIVE_NUMBERS.items():
        value = OmegaConf.select(cfg, key, default=1)
        if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
            problems.append(f"{key}={value!r} must be a positive number (seconds)")
    problems.append(alloc_conf_problem(cfg.trainer.get("cuda_alloc_conf")))
    problems.extend(check_rollout_settings(cfg))
    problems.extend(check_algorithm_settings(cfg))
    problems.extend(checkpoint_contents_problems(cfg))
    problems.extend(fsdp_size_problems(cfg))
    problems.append(node_policy_problem(cfg))
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
                f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} (prompts) "
                f"must divide data.train_batch_size={prompts}"
            )
    if len(problems) == 1:
        raise ConfigError(problems[0])  # one line, as `error: <what is wrong>`
    if problems:
        raise ConfigError(f"invalid configuration ({len(problems)} problems):\n  " + "\n  ".join(problems))
