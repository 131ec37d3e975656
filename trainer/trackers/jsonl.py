"""`jsonl`: `logs/metrics.jsonl`, one JSON record per step (and `logs/val_generations.jsonl`, one per validation
sample that trainer.log_val_generations shows). A resumed run first drops the records past its
checkpoint (rewriting the file atomically), so every step appears once, as the resumed run logged it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FILE_NAME = "metrics.jsonl"
GENERATIONS_FILE = "val_generations.jsonl"  # trainer.log_val_generations: one record per sample shown


def _step(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:  # the half-written last line of a killed run
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None


def keep_steps_up_to(path: Path, last_step: int | None) -> None:
    """Keep the records with step <= `last_step` (none when None: the run starts at step 0)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [] if last_step is None else [
        line for line in lines if (step := _step(line)) is not None and step <= last_step and line.endswith("\n")
    ]
    if kept == lines:
        return
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w") as out:
        out.writelines(kept)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)


class JsonlTracker:
    def __init__(self, log_dir: Path, resume_step: int | None = None, **run: Any) -> None:
        self.path = Path(log_dir) / FILE_NAME
        keep_steps_up_to(self.path, resume_step)
        self._file = open(self.path, "a")
        self.generations_path = Path(log_dir) / GENERATIONS_FILE
        keep_steps_up_to(self.generations_path, resume_step)
        self._generations: Any = None  # opened at the first samples

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        if self._generations is None:
            self._generations = open(self.generations_path, "a")
        self._generations.writelines(json.dumps({"step": step, **sample}) + "\n" for sample in samples)
        self._generations.flush()

    def finish(self) -> None:
        self._file.close()
        if self._generations is not None:
            self._generations.close()
