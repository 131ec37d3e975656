"""One source of defaults: workers/defaults/<section>.yaml holds every worker key's default, the spec in
workers/config.py checks each of them, and the trainer's config composes the same files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from omegaconf import OmegaConf
from pydantic import TypeAdapter

from trainer.config_loader import load_config
from workers.config import WORKER_SECTIONS, actor_rollout_ref_config, critic_config
from workers.default_values import REQUIRED, section_defaults

TRAINER_YAML = "trainer/config/trainer.yaml"


def leaves(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping) and value and not _is_field_map(prefix + key):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _is_field_map(dotted: str) -> bool:
    """Keys whose value is itself a mapping (free-form or nested)."""
    return dotted.endswith(("override_config", "engine_kwargs"))


@pytest.mark.parametrize("section", sorted(WORKER_SECTIONS))
def test_every_key_has_one_yaml_default_that_its_check_accepts(section: str) -> None:
    spec = leaves(WORKER_SECTIONS[section])
    defaults = leaves(section_defaults(section))
    assert sorted(defaults) == sorted(spec), "the yaml and the spec name different keys"
    for key, value in defaults.items():
        if value == REQUIRED:
            continue
        assert TypeAdapter(spec[key].kind).validate_python(value) == value, f"{section}.{key}: its default {value!r} fails its check"


def test_a_default_that_follows_a_key_follows_the_users_value_outside_the_trainer() -> None:
    config = actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {"use_dynamic_bsz": True, "ulysses_sequence_parallel_size": 2}})
    assert config["rollout"]["log_prob_use_dynamic_bsz"] is True
    assert config["ref"]["log_prob_use_dynamic_bsz"] is True
    assert config["ref"]["ulysses_sequence_parallel_size"] == 2
    assert actor_rollout_ref_config({"model": {"path": "/m"}})["ref"]["log_prob_use_dynamic_bsz"] is False


def test_verl_defaults_where_the_names_match() -> None:
    actor = actor_rollout_ref_config({"model": {"path": "/m"}})
    assert actor["actor"]["optim"]["lr"] == 1e-6 and actor["actor"]["optim"]["weight_decay"] == 0.01
    assert actor["actor"]["ppo_mini_batch_size"] == 256 and actor["actor"]["use_kl_loss"] is False
    assert actor["rollout"]["n"] == 1
    critic = critic_config({"model": {"path": "/m"}})
    assert critic["optim"]["lr"] == 1e-5 and critic["ppo_max_token_len_per_gpu"] == 32768


def test_the_trainer_composes_the_workers_defaults_and_sets_only_its_own_keys() -> None:
    """Every worker key the trainer's yaml (and the algorithm) leaves alone has the worker's default there."""
    own = OmegaConf.to_container(OmegaConf.load(TRAINER_YAML), resolve=False)
    algorithm = OmegaConf.to_container(OmegaConf.load("trainer/config/algorithm/grpo.yaml"), resolve=False)
    cfg = load_config(["trainer.device=cpu"])
    for section in WORKER_SECTIONS:
        set_here = set(leaves(own.get(section, {}))) | set(leaves(algorithm.get(section, {})))
        composed = leaves(OmegaConf.to_container(cfg[section], resolve=True))
        following = leaves(section_defaults(section, _nested(composed)))  # `${..x}` defaults follow the trainer's x
        defaults = {key: following[key] for key in leaves(section_defaults(section))}
        assert set(defaults) <= set(composed), f"{section}: the trainer's config lacks worker keys"
        differing = {k for k in defaults if k not in set_here and composed[k] != defaults[k] and defaults[k] != REQUIRED}
        assert not differing, f"{section}: the trainer changes worker defaults it does not declare: {sorted(differing)}"


def _nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, last = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out
