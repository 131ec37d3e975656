"""The id of a wandb or mlflow run and the last step it received, kept beside the logs, so that a run resumed
from a checkpoint continues the same run and sends each step once (these services keep what they received:
the steps a stopped run logged after its last checkpoint stay as first logged)."""

from __future__ import annotations

import json
import os
from pathlib import Path


class RunRecord:
    """`<log_dir>/<name>.json`: {"run_id", "last_step", "store"}; read only when the run resumes."""

    def __init__(self, path: Path, resume_step: int | None, store: str = "") -> None:
        self.path = path
        self.store = store
        stored = self._read() if resume_step is not None else None
        if stored and stored.get("store", "") != store:  # another wandb project / mlflow server: a new run
            stored = None
        self.resumed_id: str | None = stored["run_id"] if stored else None
        self.last_step: int = int(stored["last_step"]) if stored else -1
        self.run_id = ""

    def _read(self) -> dict | None:
        try:
            stored = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return stored if isinstance(stored, dict) and isinstance(stored.get("run_id"), str) else None

    def start(self, run_id: str) -> None:
        self.run_id = run_id
        self._write()

    def already_sent(self, step: int) -> bool:
        return step <= self.last_step

    def sent(self, step: int) -> None:
        self.last_step = step
        self._write()

    def _write(self) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps({"run_id": self.run_id, "last_step": self.last_step, "store": self.store}))
        os.replace(temporary, self.path)
