"""The backends `trainer.logger` names (console, jsonl, tensorboard, wandb, mlflow, or your own class as
`path/to/file.py:ClassName`): the interface is in spec.py, one file per backend; `trainer.tracking.Tracker`
sends each step to all of them. A backend's package is imported only when it is configured."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from trainer.trackers.spec import BUILT_IN, RunInfo, StepTracker, TrackerError, check_entries, load_tracker_class

__all__ = ["BUILT_IN", "RunInfo", "StepTracker", "TrackerError", "check_entries", "open_backend"]


# entry -> (module, class) of the built-in backends, imported only when configured
_BACKENDS = {
    "console": ("trainer.trackers.console", "ConsoleTracker"),
    "jsonl": ("trainer.trackers.jsonl", "JsonlTracker"),
    "tensorboard": ("trainer.trackers.tensorboard", "TensorBoardTracker"),
    "wandb": ("trainer.trackers.wandb_backend", "WandbTracker"),
    "mlflow": ("trainer.trackers.mlflow_backend", "MlflowTracker"),
}


def open_backend(entry: str, run: RunInfo, print_fn: Callable[[str], Any] = print) -> StepTracker:
    """Construct the tracker `entry` names; a failure names the entry (TrackerError)."""
    try:
        if entry not in _BACKENDS:
            return load_tracker_class(entry)(**run.keywords())
        module, name = _BACKENDS[entry]
        extra = {"print_fn": print_fn} if entry == "console" else {}
        return getattr(importlib.import_module(module), name)(**extra, **run.keywords())
    except TrackerError:
        raise
    except Exception as error:  # noqa: BLE001 - e.g. wandb without an account: one line naming the entry
        hint = " (WANDB_MODE=offline logs without an account or network)" if entry == "wandb" else ""
        raise TrackerError(
            f"trainer.logger entry {entry!r} could not start: {type(error).__name__}: {error}{hint}"
        ) from error
