"""A tracker of one's own (`trainer.logger=[...,tests/reliability/pausing_tracker.py:PausingTracker]`) for the
Ctrl-C-and-resume test: it records what it receives and, in a run that starts at step 0, stops after step 3
(listed last, it runs after the other trackers got the step) until the test interrupts the run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

PAUSE_AT_STEP = 3
RECEIVED_FILE = "pausing_tracker.jsonl"
PAUSED_MARKER = "paused"


class PausingTracker:
    def __init__(self, project_name: str, experiment_name: str, config: dict, log_dir: Path, resume_step: int | None) -> None:
        self.log_dir = Path(log_dir)
        self.pause = resume_step is None
        self._write({"resume_step": resume_step})

    def _write(self, record: dict[str, Any]) -> None:
        with open(self.log_dir / RECEIVED_FILE, "a") as file:
            file.write(json.dumps(record) + "\n")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._write({"step": step, **metrics})
        if self.pause and step == PAUSE_AT_STEP:
            (self.log_dir / PAUSED_MARKER).write_text(str(step))
            time.sleep(3600)  # interrupted here
