"""Where the primary config comes from: the trainer's own (`trainer`, or verl's names for it, `ppo_trainer` and
`ppo_megatron_trainer`), or a user's yaml named by `--config-path` / `--config-name` as in verl's launch scripts.

A user's yaml is read as data (never evaluated), its keys checked like command-line overrides, and composed
from a copy without the keys that only verl reads, with the user's folder and the trainer's configs on hydra's
search path, so its `defaults: [ppo_trainer, _self_]` and any groups beside it resolve.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from workers.default_values import SECTIONS, section_yaml

CONFIG_MODULE = "trainer.config"
WORKER_DEFAULTS_GROUP = "worker_defaults"  # trainer.yaml's defaults list composes each worker section from it


def register_worker_defaults() -> None:
    """The workers' own yaml defaults (workers/defaults/), offered to hydra as configs of one group, so that the
    trainer composes the very file a worker built outside it reads."""
    for section in SECTIONS:
        ConfigStore.instance().store(group=WORKER_DEFAULTS_GROUP, name=section, node=section_yaml(section))


register_worker_defaults()
PATH_FLAGS = ("--config-path", "-cp")
NAME_FLAGS = ("--config-name", "-cn")


class ConfigSourceError(ValueError):
    """A `--config-path` / `--config-name` that names no config, or a user's yaml that cannot be read."""


@dataclass(frozen=True)
class ConfigSource:
    name: str  # the primary config's name, without `.yaml`
    user_file: Path | None = None  # a user's yaml; None: the trainer's package config of that name


def built_in_names() -> list[str]:
    folder = resources.files(CONFIG_MODULE)
    return sorted(entry.name[: -len(".yaml")] for entry in folder.iterdir() if entry.name.endswith(".yaml"))


def config_groups(source: ConfigSource) -> set[str]:
    """The config groups a `name=value` override may select (folders beside the primary configs)."""
    folders = [resources.files(CONFIG_MODULE)]
    if source.user_file is not None:
        folders.append(source.user_file.parent)
    return {
        entry.name
        for folder in folders
        for entry in folder.iterdir()
        if entry.is_dir() and not entry.name.startswith("_")
    }


def split_config_flags(args: Sequence[str]) -> tuple[list[str], str | None, str | None]:
    """`(other args, --config-path value, --config-name value)`; each flag as `--flag=value` or `--flag value`."""
    rest: list[str] = []
    found: dict[str, str] = {}
    items = list(args)
    at = 0
    while at < len(items):
        arg = items[at]
        flag, has_value, value = arg.partition("=")
        if flag in PATH_FLAGS + NAME_FLAGS:
            if not has_value:
                if at + 1 >= len(items):
                    raise ConfigSourceError(f"{flag} needs a value")
                value, at = items[at + 1], at + 1
            found["path" if flag in PATH_FLAGS else "name"] = value.strip("'\"")
        else:
            rest.append(arg)
        at += 1
    return rest, found.get("path"), found.get("name")


def find_source(config_path: str | None, config_name: str, from_flag: bool = False) -> ConfigSource:
    """The user's `<config_path>/<config_name>.yaml` when it exists, else the package's config of that name.
    `from_flag`: the name came from `--config-name` (so it must be a file or a built-in name); callers' own
    names (a recipe's registered config) go to hydra as they are."""
    name = config_name[: -len(".yaml")] if config_name.endswith(".yaml") else config_name
    if config_path is not None:
        user_file = Path(config_path).expanduser() / f"{name}.yaml"
        if user_file.is_file():
            return ConfigSource(name, user_file.resolve())
    if name in built_in_names() or (config_path is None and not from_flag):
        return ConfigSource(name)
    where = f"no {name}.yaml in --config-path={config_path}, and " if config_path is not None else ""
    raise ConfigSourceError(
        f"--config-name={config_name}: {where}no built-in config has that name; built-in: {built_in_names()} "
        "(ppo_trainer and ppo_megatron_trainer are verl's names)"
    )


def read_user_file(user_file: Path) -> tuple[list[Any], dict[str, Any]]:
    """`(defaults list, the other keys)` of a user's yaml; its `hydra:` section is dropped (the search path is
    set here)."""
    try:
        data = OmegaConf.to_container(OmegaConf.load(user_file), resolve=False)
    except Exception as error:  # a yaml syntax error, from the yaml library
        raise ConfigSourceError(f"{user_file}: not a readable yaml config ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigSourceError(f"{user_file}: a config file must hold a mapping of keys, got {type(data).__name__}")
    defaults = data.pop("defaults", ["ppo_trainer", "_self_"])
    data.pop("hydra", None)
    return list(defaults), data


def leaf_entries(data: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of nested `data` as `(dotted key, value)`."""
    for name, value in data.items():
        if isinstance(value, dict) and value:
            yield from leaf_entries(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def drop_keys(data: dict[str, Any], dotted: Sequence[str]) -> dict[str, Any]:
    """A copy of nested `data` without the given dotted leaves."""
    copy = OmegaConf.to_container(OmegaConf.create(data), resolve=False)
    for key in dotted:
        *parents, last = key.split(".")
        node = copy
        for part in parents:
            node = node[part]
        del node[last]
    return copy


@contextmanager
def user_config_dir(user_file: Path, defaults: list[Any], data: dict[str, Any]) -> Iterator[str]:
    """A folder holding `<name>.yaml` = the user's `defaults` and `data` (what hydra composes)."""
    with tempfile.TemporaryDirectory(prefix="user_config_") as folder:
        OmegaConf.save(OmegaConf.create({"defaults": defaults, **data}), Path(folder) / user_file.name)
        yield folder


def compose_source(
    source: ConfigSource,
    overrides: Sequence[str],
    defaults: list[Any] | None = None,
    data: dict[str, Any] | None = None,
) -> DictConfig:
    """Compose `source` with hydra `overrides`; a user's file from `defaults` + `data` (its checked keys)."""
    if source.user_file is None:
        with initialize_config_module(CONFIG_MODULE, version_base=None):
            return compose(source.name, overrides=list(overrides))
    search = f"hydra.searchpath=[file://{source.user_file.parent},pkg://{CONFIG_MODULE}]"
    with user_config_dir(source.user_file, defaults or [], data or {}) as folder:
        with initialize_config_dir(folder, version_base=None):
            return compose(source.name, overrides=[search, *overrides])
