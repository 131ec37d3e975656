"""Import every module of the project's packages, optionally with some packages hidden, and print each one
that fails: a module-level import of a package the base install (`pip install -e .`) does not provide.

    python -m tests.base_imports                     # in a venv holding only the base install (CI does this)
    python -m tests.base_imports vllm megatron ...   # in a fuller environment: these import names hidden

`optional_import_names()` lists the packages the extras name, as import names, for the test that runs this
with them hidden. (What those packages pull in is not hidden there: the CI step runs this in a venv holding
only the base install, which judges everything.)
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "single_controller", "workers", "trainer", "recipes")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def optional_import_names(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """Top-level import names of the installed distributions pyproject.toml's extras name (vllm, megatron,
    wandb, mlflow, ...), leaving out any that is a base dependency too."""
    project = tomllib.loads(pyproject.read_text())["project"]
    base = {_canonical(Requirement(line).name) for line in project["dependencies"]}
    listed = [Requirement(line).name for lines in project["optional-dependencies"].values() for line in lines]
    optional = {_canonical(name) for name in listed} - base - {_canonical(project["name"])}
    names = {module for module, dists in metadata.packages_distributions().items()
             if any(_canonical(dist) in optional for dist in dists)}
    return sorted(name for name in names if name.isidentifier())


def project_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        names += [info.name for info in pkgutil.walk_packages([str(REPO_ROOT / package)], package + ".")]
    return names


def failed_imports(hidden: Iterable[str]) -> list[str]:
    """Each project module that does not import with `hidden` blocked, with the error."""
    for name in hidden:  # None in sys.modules: `import name` fails, find_spec(name) says absent
        sys.modules[name] = None
    failed = []
    for module in project_modules():
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - every failing module is listed, whatever the reason
            failed.append(f"{module}: {type(error).__name__}: {error}")
    return failed


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    failures = failed_imports(sys.argv[1:])
    print("\n".join(failures) if failures else f"all {len(project_modules())} modules import")
    sys.exit(1 if failures else 0)
