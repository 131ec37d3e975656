"""Algorithms written as plain driver loops over the stock worker groups (see docs/recipes.md).

`python -m trainer.main recipe=<name> [overrides]` runs `RECIPES[name]`'s `main`.
"""

from __future__ import annotations

import importlib
from typing import Callable, Sequence

RECIPES: dict[str, str] = {"online_dpo": "recipes.online_dpo"}


def recipe_main(name: str) -> Callable[[Sequence[str]], int]:
    """The `main(argv) -> exit code` of recipe `name`; ValueError naming the known recipes otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {sorted(RECIPES)}")
    return importlib.import_module(RECIPES[name]).main
