"""Checkpoint folders of a run: `global_step_N/` written atomically, `latest_checkpointed_iteration.txt`.

The format shared by the driver's checkpoints (trainer/checkpointing.py) and the strategy API's
(workers/strategy/checkpoint_folders.py), so it sits below both.

A step's folder is first written as `.global_step_N.tmp` (every role saves into it, plus the driver's own
state), then `MANIFEST.json` (every file with its size) is written last, and only then is the folder
renamed. A crash or kill -9 mid-save therefore never leaves a `global_step_N` without a manifest, and a
folder whose files do not match its manifest (truncated, deleted, copied partially) is detected before
loading: `resume_mode=auto` skips it with a warning, an explicit path raises `CheckpointError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

LATEST_FILE = "latest_checkpointed_iteration.txt"
DRIVER_STATE_FILE = "driver_state.json"
MANIFEST_FILE = "MANIFEST.json"
MANIFEST_FORMAT = 1
STEP_PREFIX = "global_step_"
TMP_SUFFIX = ".tmp"


class CheckpointError(FileNotFoundError):
    """A checkpoint folder that is missing, partial or corrupt; the message says which and why."""


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step}"


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


# ---- manifest -------------------------------------------------------------------------------------------
def _file_sizes(folder: Path) -> dict[str, int]:
    return {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }


def _fsync_dir(folder: Path) -> None:
    # Makes a rename durable across a power loss, not only a process kill (no-op where unsupported).
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_manifest(folder: str | Path, step: int) -> Path:
    """Record every file of `folder` with its size; written last, it marks the folder complete."""
    folder = Path(folder)
    manifest = {"format": MANIFEST_FORMAT, "step": step, "complete": True, "files": _file_sizes(folder)}
    path = folder / MANIFEST_FILE
    with open(path, "w") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    return path


def checkpoint_problem(folder: str | Path) -> str | None:
    """Why `folder` is not a whole checkpoint, or None when every file its manifest lists is there intact."""
    folder = Path(folder)
    if not folder.is_dir():
        return "the folder does not exist"
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        return f"it has no {MANIFEST_FILE}, so its save never finished (or it was written by an older version)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = dict(manifest["files"])
        complete = manifest.get("complete") is True
    except (ValueError, KeyError, TypeError) as error:
        return f"its {MANIFEST_FILE} is unreadable ({type(error).__name__}: {error})"
    if not complete:
        return f"its {MANIFEST_FILE} does not mark it complete"
    if DRIVER_STATE_FILE not in files:
        return f"its {MANIFEST_FILE} lists no {DRIVER_STATE_FILE}"
    bad = []
    for name, size in files.items():
        file = folder / name
        if not file.is_file():
            bad.append(f"{name} is missing")
        elif file.stat().st_size != size:
            bad.append(f"{name} has {file.stat().st_size} bytes, the manifest says {size}")
    if bad:
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        return "files differ from its manifest: " + "; ".join(bad[:5]) + more
    return None


# ---- saving ---------------------------------------------------------------------------------------------
def save_checkpoint(
    root: str | Path,
    step: int,
    driver_state: dict[str, Any],
    save_roles: Callable[[Path], None],
    keep: int | None = None,
) -> Path:
    """Write step `step`: `save_roles(tmp_dir)` saves every worker role, then the driver state and the
    manifest; then rename. With `keep`, only the newest `keep` complete checkpoints stay."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    final = step_dir(root, step)
    tmp = root / f".{final.name}{TMP_SUFFIX}"
    # Leftovers of saves that were killed: never complete, never loaded, safe to drop.
    for stale in root.glob(f".{STEP_PREFIX}*{TMP_SUFFIX}"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()
    save_roles(tmp)
    (tmp / DRIVER_STATE_FILE).write_text(json.dumps(driver_state))
    write_manifest(tmp, step)
    _replace_dir(tmp, final)
    _fsync_dir(root)
    latest_tmp = root / f".{LATEST_FILE}{TMP_SUFFIX}"
    latest_tmp.write_text(str(step))
    os.replace(latest_tmp, root / LATEST_FILE)
    if keep is not None and keep > 0:
        _prune(root, keep)
    return final


def _replace_dir(source: Path, target: Path) -> None:
    """Rename `source` to `target`; an existing `target` is moved aside first (os.replace needs that)."""
    if not target.exists():
        os.replace(source, target)
        return
    aside = target.parent / f".{target.name}.old{TMP_SUFFIX}"
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(target, aside)
    os.replace(source, target)
    shutil.rmtree(aside, ignore_errors=True)


def _step_folders(root: Path) -> list[tuple[int, Path]]:
    """Every `global_step_N` folder under `root`, newest first."""
    found = []
    for path in root.glob(f"{STEP_PREFIX}*"):
        suffix = path.name[len(STEP_PREFIX):]
        if suffix.isdigit() and path.is_dir():
            found.append((int(suffix), path))
    return sorted(found, reverse=True)


def _prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; drop every step folder older than the oldest kept."""
    complete = [step for step, path in _step_folders(root) if checkpoint_problem(path) is None]
    if len(complete) <= keep:
        return
    oldest_kept = complete[keep - 1]
    for step, path in _step_folders(root):
        if step < oldest_kept:
            shutil.rmtree(path, ignore_errors=True)


# ---- resuming -------------------------------------------------------------------------------------------
def find_resume_dir(root: str | Path, resume_mode: str, warn: bool = True) -> Path | None:
    """`disable` → None; `auto` → the newest whole `global_step_N`, None when there is no step folder at all
    (`CheckpointError` when there are some but none is whole); otherwise the given path, which must be a
    whole checkpoint (`CheckpointError` says what is wrong with it). `warn=False` skips the printed
    warnings (for an early check that the real lookup repeats)."""
    if resume_mode == "disable":
        return None
    if resume_mode != "auto":
        path = Path(resume_mode)
        problem = checkpoint_problem(path)
        if problem is not None:
            raise CheckpointError(
                f"trainer.resume_mode={resume_mode!r} is not a complete checkpoint folder: {problem}. Point it at "
                f"a whole {STEP_PREFIX}N folder, or use trainer.resume_mode=auto to take the newest whole one."
            )
        return path
    root = Path(root)
    skipped = []
    for step, path in _step_folders(root):
        problem = checkpoint_problem(path)
        if problem is None:
            if warn:
                _note_latest_file(root, step)
            return path
        if warn:
            _warn(f"skipping checkpoint {path}: {problem}")
        skipped.append(f"{path.name}: {problem}")
    if skipped:
        # Starting over silently would later overwrite or prune them: let a person decide.
        raise CheckpointError(
            f"trainer.resume_mode=auto found checkpoints under {root} but none is whole:\n  " + "\n  ".join(skipped)
            + "\nRemove or repair them, name one with trainer.resume_mode=<path>, or start from step 0 with "
            "trainer.resume_mode=disable."
        )
    return None


def _note_latest_file(root: Path, step: int) -> None:
    latest = root / LATEST_FILE
    try:
        recorded = int(latest.read_text().strip()) if latest.is_file() else None
    except ValueError:
        recorded = None
    if recorded is not None and recorded != step:
        _warn(f"{latest} names step {recorded}, but the newest whole checkpoint is step {step}; resuming from {step}")


def load_driver_state(path: str | Path) -> dict[str, Any]:
    file = Path(path) / DRIVER_STATE_FILE
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"cannot read the driver state of checkpoint {path}: {type(error).__name__}: {error}"
        ) from None
