"""Recipe files written as `from recipes.runner import recipe_main` keep working: the runner moved to
trainer/recipe_runner.py (the driver composes a recipe's config), where new code imports it from."""

from trainer.recipe_runner import (
    find_recipe,
    load_recipe_config,
    load_recipe_file,
    recipe_file,
    recipe_main,
    register_recipe_config,
)

__all__ = [
    "find_recipe",
    "load_recipe_config",
    "load_recipe_file",
    "recipe_file",
    "recipe_main",
    "register_recipe_config",
]
