"""`wandb`: a Weights & Biases run named `trainer.project_name` / `trainer.experiment_name`, with the resolved
config. `WANDB_MODE=offline` logs without network (`wandb sync` uploads later); its files go under the run's
`logs/` unless `WANDB_DIR` is set. A resumed run continues the same run id (kept in `logs/wandb_run.json`)
and sends only the steps that run has not received yet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainer.trackers.run_record import RunRecord


class WandbTracker:
    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        config: dict[str, Any],
        log_dir: Path,
        resume_step: int | None = None,
    ) -> None:
        import wandb

        self.record = RunRecord(Path(log_dir) / "wandb_run.json", resume_step, store=project_name)
        self.wandb = wandb
        try:
            self.run = wandb.init(
                project=project_name,
                name=experiment_name,
                id=self.record.resumed_id,  # None: a new run, with an id wandb draws
                resume="allow",
                config=config,
                dir=os.environ.get("WANDB_DIR") or str(log_dir),
                reinit="create_new",  # the run object is this tracker's; other runs in the process are left alone
            )
        except BaseException:
            wandb.teardown()  # wandb reads WANDB_* once per setup: the next run in this process reads them again
            raise
        self.record.start(self.run.id)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if self.record.already_sent(step):
            return
        self.run.log(metrics, step=step)
        self.record.sent(step)

    def log_generations(self, samples: list[dict[str, Any]], step: int) -> None:
        """trainer.log_val_generations: a table of the validation samples, at the step's own index."""
        if self.record.already_sent(step):
            return
        rows = [[step, sample["input"], sample["output"], sample["score"]] for sample in samples]
        table = self.wandb.Table(columns=["step", "input", "output", "score"], data=rows)
        self.run.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self.run.finish()
        self.wandb.teardown()
