"""Run a recipe that lives anywhere: a `.py` file, or a folder holding `<folder name>.py`.

A recipe module defines `run(cfg) -> metric history` and declares its config in either or both ways:
  - `<stem>.yaml` next to the file: values over the trainer's config (`trainer.total_training_steps: 30`)
    and new sections of its own;
  - `CONFIG_SECTIONS = {"section": SomeDataclass}`: typed sections (a wrong type fails like any bad value).
The declared config is composed over the trainer's (`trainer/config/trainer.yaml`) with the command-line
overrides and checked the same way: unknown keys fail with the valid keys of that level, `--cfg job`
prints it. Both `python my_recipe.py [overrides]` (the file ends with
`sys.exit(recipe_main(__name__))`) and `python -m trainer.main recipe=path/to/my_recipe.py [overrides]` work.

The runner is the driver's (it composes and checks the trainer's config); the built-in recipes live a floor
above, in recipes/, and `BUILT_IN_RECIPES` names their modules as strings, imported only when a run asks for
one, so trainer/ never imports recipes/.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from trainer.cli import run_cli
from trainer.config_loader import load_config

CONFIG_GROUP = "_recipe"  # where recipe configs are registered in hydra's ConfigStore
# `recipe=<name>` -> the module that defines the recipe (a new built-in recipe adds its line here).
BUILT_IN_RECIPES: dict[str, str] = {"online_dpo": "recipes.online_dpo", "raft": "recipes.raft"}


def recipe_file(target: str | os.PathLike) -> Path:
    """The `.py` file a recipe path names: the file itself, or `<folder>/<folder name>.py`."""
    path = Path(target).expanduser().resolve()
    if path.is_dir():
        path = path / f"{path.name}.py"
    if path.suffix != ".py" or not path.is_file():
        raise ValueError(
            f"recipe {str(target)!r} is not a recipe: give a built-in name {sorted(BUILT_IN_RECIPES)}, a .py file, "
            f"or a folder holding <folder name>.py (looked for {path})"
        )
    return path


def load_recipe_file(target: str | os.PathLike) -> ModuleType:
    """Import a recipe file under its own name, with its folder importable here and in the workers."""
    path = recipe_file(target)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # the recipe's sibling modules
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if folder not in paths:  # init_ray hands PYTHONPATH to the workers, which may unpickle the recipe's classes
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, *paths]))
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise ValueError(
            f"recipe file {path} is named like the module {name!r} already imported from {loaded.__file__}; "
            "rename the file"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def find_recipe(target: str) -> ModuleType:
    """A built-in recipe by name (`BUILT_IN_RECIPES`) or a recipe file/folder by path."""
    if target in BUILT_IN_RECIPES:
        return importlib.import_module(BUILT_IN_RECIPES[target])
    return load_recipe_file(target)


def _declared_config(module: ModuleType) -> dict[str, Any]:
    """The recipe's config node: the trainer's config, then `<stem>.yaml`, then the typed sections."""
    file = Path(module.__file__)
    values = {}
    yaml_file = file.with_suffix(".yaml")
    if yaml_file.is_file():
        values = yaml.safe_load(yaml_file.read_text()) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{yaml_file} must hold a mapping of config sections, got {type(values).__name__}")
    node: dict[str, Any] = {"defaults": values.pop("defaults", ["/trainer", "_self_"]), **values}
    for section, schema in getattr(module, "CONFIG_SECTIONS", {}).items():
        typed = OmegaConf.structured(schema)
        node[section] = OmegaConf.merge(typed, values[section]) if section in values else typed
    return node


def register_recipe_config(module: ModuleType) -> str:
    """Register the recipe's config with hydra; returns the name `load_config` composes it by."""
    name = f"{CONFIG_GROUP}/{Path(module.__file__).stem}"
    ConfigStore.instance().store(
        name=name.split("/", 1)[1], group=CONFIG_GROUP, node=_declared_config(module), package="_global_"
    )
    return name


def load_recipe_config(module: ModuleType, overrides: Sequence[str] = ()) -> Any:
    """The recipe's resolved and checked config with `overrides` applied."""
    return load_config(overrides, config_name=register_recipe_config(module))


def recipe_main(recipe: str | ModuleType, argv: Sequence[str] | None = None) -> int:
    """Command line of a recipe: `recipe_main(__name__)` at the end of a recipe file, or a path/name."""
    if isinstance(recipe, str):
        recipe = sys.modules[recipe] if recipe in sys.modules else find_recipe(recipe)
    if not callable(getattr(recipe, "run", None)):
        raise ValueError(f"recipe {recipe.__file__} defines no run(cfg) function")
    args = sys.argv[1:] if argv is None else list(argv)
    return run_cli(args, lambda overrides: load_recipe_config(recipe, overrides), recipe.run)
