"""Whether LoRA can run with the installed peft and transformers.

LoRA adds its adapters through transformers' PEFT integration (`model.add_adapter`), which refuses a peft
older than the minimum that transformers release names (`MIN_PEFT_VERSION` in its integrations/peft.py;
5.24 asks for 0.22). That minimum is read from the installed transformers, so the check follows whatever
release is installed instead of a table kept here.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata

from packaging.version import Version

REINSTALL_HINT = "pip install -e . (it installs a transformers and a peft that work together)"


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution` (a pip name), or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def transformers_min_peft() -> str | None:
    """The oldest peft the installed transformers' PEFT integration accepts, or None if it does not say."""
    try:
        from transformers.integrations.peft import MIN_PEFT_VERSION
    except ImportError:  # a release without the constant: nothing to check against
        return None
    return str(MIN_PEFT_VERSION)


def peft_problem(peft_version: str | None, min_peft: str | None, transformers_version: str | None) -> str | None:
    """Why LoRA cannot run with these versions (None: it can). `peft_version` None means peft is missing."""
    if peft_version is None:
        return f"LoRA needs the peft package, which is not installed: {REINSTALL_HINT}"
    if min_peft is not None and Version(peft_version) < Version(min_peft):
        return (
            f"LoRA needs peft>={min_peft} with transformers {transformers_version} (the minimum of its PEFT "
            f"integration), but peft {peft_version} is installed: {REINSTALL_HINT}"
        )
    return None


def installed_peft_problem() -> str | None:
    """`peft_problem` for the packages installed in this Python environment."""
    peft_version = installed_version("peft") if importlib.util.find_spec("peft") is not None else None
    return peft_problem(peft_version, transformers_min_peft(), installed_version("transformers"))
