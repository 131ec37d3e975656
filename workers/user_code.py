"""Run a user's .py file named in the config (a reward function, a tool, an environment, a tracker) as a module.

Only importlib is used, never eval. The file is executed as a fresh module that is NOT registered in
sys.modules: Ray's cloudpickle then ships its functions to workers by value, whereas a registered name would
be pickled by reference and fail to import there.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType


def load_python_file(path: str, what: str = "reward function") -> ModuleType:
    """Execute the .py file at `path` as a fresh, unregistered module (`what` names it in errors)."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"{what} file {path!r} does not exist (resolved to {file})")
    # Unique per file so two reward files with the same stem never clash in tracebacks/logs.
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:8]
    spec = importlib.util.spec_from_file_location(f"_reward_{file.stem}_{digest}", file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {what} file {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
