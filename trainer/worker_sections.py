"""The trainer's worker sections as the workers take them: its config without the keys only the driver reads.
trainer/role_groups.py adds what it computes at start; the config loader checks every value with the workers'
own schema (workers/config_schema.py) before anything starts."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from workers.config import complete_section

REWARD_DRIVER_KEYS = ("enable", "reward_manager", "overlong_buffer", "reward_kwargs")


def actor_section(cfg: DictConfig) -> dict[str, Any]:
    section = OmegaConf.to_container(cfg.actor_rollout_ref, resolve=True)
    section["actor"].pop("checkpoint")  # what a checkpoint holds: the driver's choice (RoleGroups.save)
    return section


def critic_section(cfg: DictConfig) -> dict[str, Any]:
    section = OmegaConf.to_container(cfg.critic, resolve=True)
    section.pop("checkpoint")  # the driver's choice (RoleGroups.save)
    return section


def reward_model_section(cfg: DictConfig) -> dict[str, Any]:
    section = OmegaConf.to_container(cfg.reward_model, resolve=True)
    for driver_key in REWARD_DRIVER_KEYS:  # the driver's reward manager, not the worker's
        section.pop(driver_key, None)
    return section


def worker_value_problems(cfg: DictConfig) -> list[str]:
    """Every value of the worker sections the workers' schema refuses, a line each (the rules across keys are
    the workers' and run in the preflight checks, on the sections as the workers get them)."""
    sections = [("actor_rollout_ref", actor_section), ("critic", critic_section)]
    if cfg.reward_model.enable:
        sections.append(("reward_model", reward_model_section))
    problems: list[str] = []
    for name, section in sections:
        try:
            complete_section(name, section(cfg), where=name)
        except ValueError as error:
            problems.extend(str(error).splitlines())
    return problems
