"""Algorithms written as plain driver loops over the stock worker groups (see docs/recipes.md).

`python -m trainer.main recipe=<name> [overrides]` runs `RECIPES[name]`; `recipe=path/to/my_recipe.py` runs
a recipe file from anywhere (recipes/runner.py).
"""

RECIPES: dict[str, str] = {"online_dpo": "recipes.online_dpo", "raft": "recipes.raft"}
