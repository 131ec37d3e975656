"""The worker sections' defaults, read from workers/defaults/<section>.yaml: the one place a default lives. The
trainer's config composes the same files (trainer/config_source.py registers them with hydra's ConfigStore)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

DEFAULTS_DIR = Path(__file__).resolve().parent / "defaults"
SECTIONS = ("actor_rollout_ref", "critic", "reward_model")
REQUIRED = MISSING  # a yaml value of `???`: the user must set the key


@lru_cache(maxsize=None)
def _section_file(section: str) -> DictConfig:
    if section not in SECTIONS:
        raise ValueError(f"no worker defaults for section {section!r}; sections: {list(SECTIONS)}")
    return OmegaConf.load(DEFAULTS_DIR / f"{section}.yaml")


def section_yaml(section: str) -> DictConfig:
    """A fresh copy of the section's yaml, interpolations unresolved (what the trainer's config composes)."""
    return _section_file(section).copy()


def section_defaults(section: str, user: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The section's defaults as plain values, with the defaults that follow another key (`${..x}`) resolved
    against `user`'s value of that key where it sets one."""
    merged = section_yaml(section)
    if user:
        merged = OmegaConf.merge(merged, _only_plain(user))
    return OmegaConf.to_container(merged, resolve=True, throw_on_missing=False)


def _only_plain(user: Mapping[str, Any]) -> dict[str, Any]:
    """The user's values omegaconf can hold (the values that a default may follow are bools and numbers);
    anything else is left to the field checks, which name it when it is wrong."""
    plain: dict[str, Any] = {}
    for key, value in user.items():
        if isinstance(value, Mapping):
            plain[key] = _only_plain(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            plain[key] = value
    return plain
