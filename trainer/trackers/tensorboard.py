"""`tensorboard`: `logs/tensorboard/`. A resumed run opens the writer with `purge_step` = checkpoint step + 1,
so TensorBoard hides what the stopped run wrote past the checkpoint; a run starting at step 0 hides all."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


class TensorBoardTracker:
    def __init__(self, log_dir: Path, resume_step: int | None = None, **run: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(log_dir) / "tensorboard"
        written_before = folder.is_dir() and any(folder.glob("events.out.tfevents.*"))
        purge_step = (0 if resume_step is None else resume_step + 1) if written_before else None
        self.writer = SummaryWriter(str(folder), purge_step=purge_step)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        # One markdown table per validation (TensorBoard's text tab), as verl's tensorboard shows them.
        rows = ["| input | output | score |", "|---|---|---|"]
        rows += [f"| {_cell(s['input'])} | {_cell(s['output'])} | {s['score']:.4g} |" for s in samples]
        self.writer.add_text("val/generations", "\n".join(rows), step)

    def finish(self) -> None:
        self.writer.close()


def _cell(text: str) -> str:
    """`text` inside one markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", "<br>")
