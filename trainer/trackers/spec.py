"""What `trainer.logger` may name, and the interface every tracker implements (the built-in ones and yours).

A tracker is a class constructed with keyword arguments

    Tracker(project_name=..., experiment_name=..., config=..., log_dir=..., resume_step=...)

(`config`: the resolved run config as a plain dict; `log_dir`: the run's `logs/` folder; `resume_step`: the
checkpoint step the run resumes from, None when it starts at step 0), with `log(metrics, step)` called once
per step (metrics: name -> int, float or str), an optional `log_generations(samples, step)` (the validation
samples of trainer.log_val_generations, each {input, output, score}) and an optional `finish()` (or `close()`)
at the end.
Your own class is named in the config as `path/to/file.py:ClassName`; only that file is loaded.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainer.input_errors import InputError

BUILT_IN = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
CUSTOM_FORM = "path/to/file.py:ClassName"
CUSTOM_ENTRY = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_]\w*)$")
# verl's names for the same backends (verl's `file` writes a JSONL file).
VERL_NAMES = {"file": "jsonl"}
# The packages a built-in backend imports; a missing one fails before Ray starts.
PACKAGES = {"tensorboard": ("tensorboard",), "wandb": ("wandb",), "mlflow": ("mlflow",)}
# The local store of mlflow (no MLFLOW_TRACKING_URI) is an SQLite file, which mlflow reads through these.
MLFLOW_LOCAL_STORE_PACKAGES = ("sqlalchemy", "alembic")
# tensorboard is a base dependency; wandb and mlflow come with the project's `tracking` extra.
INSTALL_HINT = {
    "tensorboard": "pip install -e .",
    "wandb": 'pip install -e ".[tracking]"',
    "mlflow": 'pip install -e ".[tracking]"',
}
CONSTRUCTOR_KEYWORDS = ("project_name", "experiment_name", "config", "log_dir", "resume_step")


class TrackerError(InputError):
    """A `trainer.logger` entry that cannot be used; the message names it and what is valid."""


class StepTracker(Protocol):
    def log(self, metrics: dict[str, Any], step: int) -> None: ...


@dataclass(frozen=True)
class RunInfo:
    """What every tracker is constructed with (as keyword arguments)."""

    log_dir: Path
    project_name: str = ""
    experiment_name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    resume_step: int | None = None

    def keywords(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in CONSTRUCTOR_KEYWORDS}


def entry_problem(entry: Any) -> str | None:
    """Why `entry` is not a `trainer.logger` entry by its form (nothing is imported here), or None."""
    if isinstance(entry, str) and (entry in BUILT_IN or CUSTOM_ENTRY.match(entry)):
        return None
    if isinstance(entry, str) and entry in VERL_NAMES:
        return f"trainer.logger entry {entry!r} is verl's name; here it is {VERL_NAMES[entry]!r}"
    return (
        f"trainer.logger has unknown entries [{entry!r}]; valid are {list(BUILT_IN)} or '{CUSTOM_FORM}' "
        "(your own tracker class, docs/operations.md)"
    )


def _missing_packages(entry: str) -> list[str]:
    needed = list(PACKAGES.get(entry, ()))
    if entry == "mlflow" and not os.environ.get("MLFLOW_TRACKING_URI"):
        needed += MLFLOW_LOCAL_STORE_PACKAGES
    return [name for name in needed if importlib.util.find_spec(name) is None]


def load_tracker_class(entry: str) -> type:
    """The class named by a `path/to/file.py:ClassName` entry, checked against the tracker interface."""
    from workers.user_code import load_python_file

    match = CUSTOM_ENTRY.match(entry)
    if match is None:
        raise TrackerError(f"trainer.logger entry {entry!r} is not of the form '{CUSTOM_FORM}'")
    where = f"trainer.logger entry {entry!r}"
    try:
        module = load_python_file(match["path"], what="tracker")
    except FileNotFoundError as error:
        raise TrackerError(f"{where}: {error}") from None
    except Exception as error:  # noqa: BLE001 - the user's file failed to import: say how
        raise TrackerError(f"{where}: importing {match['path']} failed: {type(error).__name__}: {error}") from None
    cls = getattr(module, match["name"], None)
    if not inspect.isclass(cls):
        classes = sorted(k for k, v in vars(module).items() if inspect.isclass(v) and v.__module__ == module.__name__)
        raise TrackerError(f"{where}: {match['path']} defines no class {match['name']!r}; classes there: {classes}")
    if not callable(getattr(cls, "log", None)):
        raise TrackerError(f"{where}: class {match['name']} has no log(metrics, step) method; a tracker needs "
                           "log(metrics, step) and may define finish()")
    try:
        inspect.signature(cls).bind(**{name: None for name in CONSTRUCTOR_KEYWORDS})
    except TypeError:
        raise TrackerError(f"{where}: {match['name']}{inspect.signature(cls)} must accept the keyword arguments "
                           f"{', '.join(CONSTRUCTOR_KEYWORDS)}") from None
    return cls


def check_entries(entries: list[str]) -> None:
    """Every entry usable before anything starts: a known name whose packages are installed, or a
    loadable tracker class. Raises TrackerError naming the first bad entry."""
    for entry in entries:
        problem = entry_problem(entry)
        if problem:
            raise TrackerError(problem)
        if CUSTOM_ENTRY.match(entry):
            load_tracker_class(entry)
            continue
        missing = _missing_packages(entry)
        if missing:
            raise TrackerError(f"trainer.logger entry {entry!r} needs the package(s) {missing}, which are not "
                               f"installed: {INSTALL_HINT[entry]}")
