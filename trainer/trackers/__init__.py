"""The backends `trainer.logger` names (console, jsonl, tensorboard, wandb, mlflow, or your own class as
`path/to/file.py:ClassName`): the interface is in spec.py, one file per backend; `trainer.tracking.Tracker`
sends each step to all of them. A backend's package is imported only when it is configured."""

from __future__ import annotations

from typing import Any, Callable

from trainer.trackers.spec import BUILT_IN, RunInfo, StepTracker, TrackerError, check_entries, load_tracker_class

__all__ = ["BUILT_IN", "RunInfo", "StepTracker", "TrackerError", "check_entries", "open_backend"]


def open_backend(entry: str, run: RunInfo, print_fn: Callable[[str], Any] = print) -> StepTracker:
    """Construct the tracker `entry` names; a failure names the entry (TrackerError)."""
    try:
        if entry == "console":
            from trainer.trackers.console import ConsoleTracker

            return ConsoleTracker(print_fn=print_fn, **run.keywords())
        if entry == "jsonl":
            from trainer.trackers.jsonl import JsonlTracker

            return JsonlTracker(**run.keywords())
        if entry == "tensorboard":
            from trainer.trackers.tensorboard import TensorBoardTracker

            return TensorBoardTracker(**run.keywords())
        if entry == "wandb":
            from trainer.trackers.wandb_backend import WandbTracker

            return WandbTracker(**run.keywords())
        if entry == "mlflow":
            from trainer.trackers.mlflow_backend import MlflowTracker

            return MlflowTracker(**run.keywords())
        return load_tracker_class(entry)(**run.keywords())
    except TrackerError:
        raise
    except Exception as error:  # noqa: BLE001 - e.g. wandb without an account: one line naming the entry
        hint = " (WANDB_MODE=offline logs without an account or network)" if entry == "wandb" else ""
        raise TrackerError(
            f"trainer.logger entry {entry!r} could not start: {type(error).__name__}: {error}{hint}"
        ) from error
