"""Checkpoint folders of a run: `global_step_N/` written atomically, `latest_checkpointed_iteration.txt`.

A step's folder is first written as `.global_step_N.tmp` (every role saves into it, plus the driver's own
state) and renamed when complete, so a crash mid-save never leaves a half-written `global_step_N`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

LATEST_FILE = "latest_checkpointed_iteration.txt"
DRIVER_STATE_FILE = "driver_state.json"
STEP_PREFIX = "global_step_"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step}"


def save_checkpoint(
    root: str | Path, step: int, driver_state: dict[str, Any], save_roles: Callable[[Path], None], keep: int | None = None
) -> Path:
    """Write step `step`: `save_roles(tmp_dir)` saves every worker role, then the driver state; then rename."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_roles(tmp)
    (tmp / DRIVER_STATE_FILE).write_text(json.dumps(driver_state))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / f".{LATEST_FILE}.tmp"
    latest_tmp.write_text(str(step))
    os.replace(latest_tmp, root / LATEST_FILE)
    if keep is not None and keep > 0:
        _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    steps = sorted(int(p.name[len(STEP_PREFIX):]) for p in root.glob(f"{STEP_PREFIX}*") if p.name[len(STEP_PREFIX):].isdigit())
    for old in steps[:-keep]:
        shutil.rmtree(step_dir(root, old), ignore_errors=True)


def find_resume_dir(root: str | Path, resume_mode: str) -> Path | None:
    """`disable` → None; `auto` → the latest complete step folder (or None); otherwise the given path."""
    if resume_mode == "disable":
        return None
    if resume_mode != "auto":
        path = Path(resume_mode)
        if not (path / DRIVER_STATE_FILE).is_file():
            raise FileNotFoundError(f"trainer.resume_mode={resume_mode!r} is not a complete checkpoint folder (no {DRIVER_STATE_FILE})")
        return path
    latest = Path(root) / LATEST_FILE
    if not latest.is_file():
        return None
    path = step_dir(root, int(latest.read_text().strip()))
    if not (path / DRIVER_STATE_FILE).is_file():
        raise FileNotFoundError(f"{latest} names {path.name}, which is missing or incomplete")
    return path


def load_driver_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / DRIVER_STATE_FILE).read_text())
