"""`--help`: the usage, then what there is to choose from, read from the files themselves so the list never
goes stale: the config groups of trainer.yaml's defaults list with their choices (`trainer/config/<group>/
<choice>.yaml`, each with its first comment line), the built-in recipes, and the docs pages with their titles."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "config"
DOCS_DIR = Path(__file__).resolve().parents[1] / "docs"  # absent in an installed wheel: the section is left out
WIDTH = 120  # longest help line; descriptions are cut to fit

USAGE = """\
usage: python -m trainer.main [overrides...] [--cfg job]
       python -m trainer.main recipe=<name | path/to/my_recipe.py | path/to/folder> [overrides...] [--cfg job]
       python path/to/my_recipe.py [overrides...] [--cfg job]

Overrides are hydra syntax: `trainer.total_training_steps=10`, `algorithm=ppo`, `trainer.logger=[console,jsonl]`.
`+key=value` adds a worker setting the YAML leaves at its default (e.g. `+actor_rollout_ref.rollout.top_k=20`).
`--cfg job` prints the resolved configuration and exits without starting anything.
"""


def _first_comment(path: Path) -> str:
    """The first comment line of a YAML file that is not a hydra directive."""
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("#") and not text.startswith("# @"):
            return text.lstrip("#").strip()
    return ""


GroupChoices = tuple[str | None, list[Path]]  # the default choice, the choice files


def config_groups(config_dir: Path = CONFIG_DIR, main_config: str = "trainer.yaml") -> dict[str, GroupChoices]:
    """Each group named in the main config's defaults list: (its default choice, its choice files)."""
    defaults = yaml.safe_load((config_dir / main_config).read_text()).get("defaults", [])
    groups: dict[str, GroupChoices] = {}
    for entry in defaults:
        if isinstance(entry, dict):
            for group, default in entry.items():
                groups[group] = (default, sorted((config_dir / group).glob("*.yaml")))
    return groups


def docs_pages(docs_dir: Path = DOCS_DIR) -> list[tuple[str, str]]:
    """(file name, title) of every docs page; the title is the page's first `# ` heading."""
    pages = []
    for page in sorted(docs_dir.glob("*.md"), key=lambda p: p.name.lower()):
        title = next((line[2:].strip() for line in page.read_text().splitlines() if line.startswith("# ")), "")
        pages.append((page.name, title))
    return pages


def _row(name: str, text: str, column: int) -> str:
    row = f"  {name:<{column}}  {text}"
    return row if len(row) <= WIDTH else row[: WIDTH - 3].rstrip() + "..."


def usage_text(recipes: Sequence[str] = ()) -> str:
    """The whole `--help` text; `recipes`: the built-in recipe names (`recipe=<name>`)."""
    lines = [USAGE]
    groups = config_groups()
    choices = [(f"{group}={path.stem}" + (" (default)" if path.stem == default else ""), _first_comment(path))
               for group, (default, paths) in groups.items() for path in paths]
    if choices:
        lines.append("Config groups (trainer/config/<group>/<choice>.yaml):")
        column = max(len(name) for name, _ in choices)
        lines += [_row(name, text, column) for name, text in choices]
    if recipes:
        names = " | ".join(f"recipe={name}" for name in recipes)
        lines.append(f"\nRecipes: {names}, or recipe=path/to/my_recipe.py (docs/recipes.md)")
    pages = docs_pages() if DOCS_DIR.is_dir() else []
    if pages:
        lines.append("\nDocs (docs/):")
        column = max(len(name) for name, _ in pages)
        lines += [_row(name, title, column) for name, title in pages]
    lines.append("\nREADME.md: install, the first run, the training config. Troubleshooting: docs/operations.md.")
    return "\n".join(lines)
