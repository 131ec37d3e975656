"""Algorithms written as plain driver loops over the stock worker groups (see docs/recipes.md).

`python -m trainer.main recipe=<name> [overrides]` runs a built-in recipe (the names:
`trainer.recipe_runner.BUILT_IN_RECIPES`); `recipe=path/to/my_recipe.py` runs a recipe file from anywhere.
"""
