"""`mlflow`: an MLflow run in experiment `trainer.project_name`, named `trainer.experiment_name`, with the
flattened config as params and each step's numbers as metrics. The store is `MLFLOW_TRACKING_URI` when set,
else an SQLite file under the run's `logs/` (`logs/mlflow.db`). A resumed run continues the same run id
(kept in `logs/mlflow_run.json`) and sends only the steps that run has not received yet."""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

from trainer.config_source import leaf_entries
from trainer.trackers.run_record import RunRecord

PARAMS_PER_CALL = 100  # mlflow's batch limits
METRICS_PER_CALL = 1000
MAX_PARAM_VALUE = 6000
MAX_KEY = 250


def metric_name(key: str) -> str:
    """A name mlflow accepts (letters, digits, '_', '-', '.', ' ', ':', '/'): `pass@1` -> `pass_at_1`."""
    name = re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))
    return re.sub(r"/+", "/", name).strip("/") or "_"


def flatten(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """`{"a": {"b": 1}}` -> ("a.b", "1"); lists and scalars become their text."""
    return ((key, str(value)[:MAX_PARAM_VALUE]) for key, value in leaf_entries(config, prefix))


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MlflowTracker:
    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        config: dict[str, Any],
        log_dir: Path,
        resume_step: int | None = None,
    ) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        local_store = not os.environ.get("MLFLOW_TRACKING_URI")
        uri = (
            f"sqlite:///{(Path(log_dir) / 'mlflow.db').resolve()}" if local_store else os.environ["MLFLOW_TRACKING_URI"]
        )
        self.client = MlflowClient(tracking_uri=uri)
        self.record = RunRecord(Path(log_dir) / "mlflow_run.json", resume_step, store=uri)
        params = {key: value for key, value in flatten(config) if len(key) <= MAX_KEY}
        run = None
        if self.record.resumed_id:
            try:
                run = self.client.get_run(self.record.resumed_id)
                self.client.update_run(run.info.run_id, status="RUNNING")
            except MlflowException:  # the stored run is gone from the store: start a new one
                run, self.record.last_step = None, -1
        if run is None:
            artifacts = (Path(log_dir) / "mlflow_artifacts").resolve().as_uri() if local_store else None
            experiment = self.client.get_experiment_by_name(project_name)
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(project_name, artifacts)
            )
            run = self.client.create_run(experiment_id, run_name=experiment_name)
            logged: dict[str, str] = {}
        else:
            logged = run.data.params  # params can not change once logged: add the new ones only
        new = [Param(key, value) for key, value in params.items() if key not in logged]
        for chunk in _chunks(new, PARAMS_PER_CALL):
            self.client.log_batch(run.info.run_id, params=chunk)
        changed = sorted(key for key, value in params.items() if key in logged and logged[key] != value)
        if changed:
            print(
                f"mlflow: run {run.info.run_id} keeps its first values of the params {changed} "
                "(mlflow params can not change)"
            )
        self.record.start(run.info.run_id)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        if self.record.already_sent(step):
            return
        now = int(time.time() * 1000)
        numbers = {
            metric_name(key): float(value)
            for key, value in metrics.items()
            if isinstance(value, (int, float)) and math.isfinite(value)
        }
        entries = [Metric(key, value, now, step) for key, value in numbers.items()]
        for chunk in _chunks(entries, METRICS_PER_CALL):
            self.client.log_batch(self.record.run_id, metrics=chunk)
        self.record.sent(step)

    def finish(self) -> None:
        self.client.set_terminated(self.record.run_id)
