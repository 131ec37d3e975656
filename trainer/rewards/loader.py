"""Load the reward function named in the config: a dotted module path or a .py file.

Only importlib is used, never eval. A file runs as a fresh module that is not registered in sys.modules
(workers/user_code.py says why).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from workers.user_code import load_python_file

from .registry import compute_score


def _load_module(path: str) -> ModuleType:
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        # Only rephrase when the named module itself is missing, not one of its imports.
        if exc.name is not None and (path == exc.name or path.startswith(exc.name + ".")):
            raise ModuleNotFoundError(
                f"reward function module {path!r} not found (no module named {exc.name!r}); "
                "give an importable dotted path or a path to a .py file"
            ) from exc
        raise


def load_reward_function(path: str | None, name: str = "compute_score") -> Callable[..., Any]:
    """Return function `name` from module/file `path`; None -> the built-in `compute_score`."""
    if path is None:
        return compute_score
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"reward function path must be a non-empty string or None, got {path!r}")
    is_file = path.endswith(".py") or "/" in path or os.sep in path
    module = load_python_file(path) if is_file else _load_module(path)
    function = getattr(module, name, None)
    if function is None:
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"reward function {name!r} not found in {path!r}; callables there: {available}")
    if not callable(function):
        raise TypeError(f"{name!r} in {path!r} is a {type(function).__name__}, not a function")
    return function
