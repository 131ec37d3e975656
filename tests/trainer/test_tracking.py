"""Trackers: each backend receives every step once, a resumed run replaces (jsonl, TensorBoard) or skips
(wandb, mlflow: they keep what they received) what a stopped run logged past its checkpoint, and a tracker
class of your own (`path/to/file.py:ClassName`) gets the documented arguments."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.trainer.wandb_offline import offline_runs
from trainer.trackers import TrackerError
from trainer.trackers.mlflow_backend import flatten, metric_name
from trainer.tracking import Tracker

CONFIG = {"trainer": {"project_name": "proj", "total_training_steps": 4}, "data": {"files": ["a", "b"]}}


def stopped_then_resumed(backends, log_dir, resume_step=1, last_logged=3, **run):
    """A run that logged steps 1..`last_logged` (values 0.1 x step), then one resumed from `resume_step` that
    logs up to step 4 (values 10 x step). Returns the values each run logged, by step."""
    first, second = {}, {}
    tracker = Tracker(backends, log_dir, print_fn=lambda line: None, config=CONFIG, **run)
    for step in range(1, last_logged + 1):
        first[step] = 0.1 * step
        tracker.log({"reward/mean": first[step], "val/pass@1": 1.0, "note": "text"}, step)
    tracker.close()
    tracker = Tracker(backends, log_dir, print_fn=lambda line: None, config=CONFIG, resume_step=resume_step, **run)
    for step in range(resume_step + 1, 5):
        second[step] = 10.0 * step
        tracker.log({"reward/mean": second[step], "val/pass@1": 1.0}, step)
    tracker.close()
    return first, second


def tensorboard_scalars(folder, key):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(key)]


def test_jsonl_and_tensorboard_replace_the_steps_past_the_checkpoint(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as file:  # a run before, killed mid-write: its records go
        file.write('{"step": 1, "reward/mean": 5.0}\n{"step": 2, "rew')
    first, second = stopped_then_resumed(["jsonl", "tensorboard"], tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["reward/mean"] for r in records] == [first[1], second[2], second[3], second[4]]
    scalars = tensorboard_scalars(tmp_path / "tensorboard", "reward/mean")
    assert [step for step, _ in scalars] == [1, 2, 3, 4]
    assert [value for _, value in scalars] == pytest.approx([first[1], second[2], second[3], second[4]])
    # A run that starts again at step 0 (no checkpoint) replaces everything.
    tracker = Tracker(["jsonl", "tensorboard"], tmp_path, config=CONFIG)
    tracker.log({"reward/mean": 7.0}, 1)
    tracker.close()
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [{"step": 1, "reward/mean": 7.0}]
    assert tensorboard_scalars(tmp_path / "tensorboard", "reward/mean") == [(1, 7.0)]


def test_wandb_offline_continues_the_same_run_and_gets_each_step_once(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    first, second = stopped_then_resumed(["wandb"], tmp_path, project_name="proj", experiment_name="exp")
    run_id = json.loads((tmp_path / "wandb_run.json").read_text())["run_id"]
    stopped, resumed = offline_runs(tmp_path / "wandb", run_id)  # both under the run's log dir
    assert (stopped["project"], stopped["name"], resumed["id"]) == ("proj", "exp", run_id)
    assert stopped["config"]["trainer"] == CONFIG["trainer"]
    # wandb keeps what it received: steps 2 and 3 of the stopped run stay, the resumed run sends step 4.
    assert [(h["_step"], h["reward/mean"]) for h in stopped["history"]] == [(s, first[s]) for s in (1, 2, 3)]
    assert [(h["_step"], h["reward/mean"]) for h in resumed["history"]] == [(4, second[4])]
    assert stopped["history"][0]["val/pass@1"] == 1.0 and stopped["history"][0]["note"] == "text"


def _mlflow_steps(database, key):
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT run_uuid, step, value FROM metrics WHERE key = ? ORDER BY step", (key,)).fetchall()
    return {run for run, _, _ in rows}, [(step, value) for _, step, value in rows]


def test_mlflow_local_store_continues_the_same_run_with_sanitised_names(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first, second = stopped_then_resumed(["mlflow"], tmp_path, project_name="proj", experiment_name="exp")
    from mlflow.tracking import MlflowClient

    run_id = json.loads((tmp_path / "mlflow_run.json").read_text())["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert run.info.run_name == "exp" and client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.total_training_steps"] == "4" and run.data.params["data.files"] == "['a', 'b']"
    runs, points = _mlflow_steps(tmp_path / "mlflow.db", "reward/mean")
    assert runs == {run_id} and points == [(1, first[1]), (2, first[2]), (3, first[3]), (4, second[4])]
    assert [m.step for m in client.get_metric_history(run_id, "val/pass_at_1")] == [1, 2, 3, 4]


def test_mlflow_uses_the_tracking_uri_when_set(tmp_path, monkeypatch):
    elsewhere = tmp_path / "server.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere}")
    tracker = Tracker(["mlflow"], tmp_path / "logs", config=CONFIG, project_name="proj", experiment_name="exp")
    tracker.log({"reward/mean": 0.5}, 1)
    tracker.close()
    assert not (tmp_path / "logs" / "mlflow.db").exists()
    assert _mlflow_steps(elsewhere, "reward/mean")[1] == [(1, 0.5)]


def test_mlflow_names_and_params():
    assert metric_name("val/pass@1") == "val/pass_at_1"
    assert metric_name("reward/synthetic/char_class/mean") == "reward/synthetic/char_class/mean"
    assert metric_name("a//b (x)%/") == "a/b _x__"
    assert dict(flatten({"a": {"b": 1, "c": {}}, "d": [1, 2]})) == {"a.b": "1", "a.c": "{}", "d": "[1, 2]"}


MY_TRACKER = '''
import json
from pathlib import Path


class MyTracker:
    def __init__(self, project_name, experiment_name, config, log_dir, resume_step):
        self.file = open(Path(log_dir) / "mine.jsonl", "a")
        self.file.write(json.dumps({"project": project_name, "experiment": experiment_name,
                                    "steps": config["trainer"]["total_training_steps"], "resume_step": resume_step}) + "\\n")

    def log(self, metrics, step):
        self.file.write(json.dumps({"step": step, **metrics}) + "\\n")

    def finish(self):
        self.file.write("finished\\n")
        self.file.close()


class NoLog:
    def __init__(self, **run):
        pass


class OldSignature:
    def __init__(self, config):
        pass

    def log(self, metrics, step):
        pass
'''


def test_a_tracker_class_of_your_own(tmp_path):
    (tmp_path / "my_tracker.py").write_text(MY_TRACKER)
    tracker = Tracker([f"{tmp_path / 'my_tracker.py'}:MyTracker"], tmp_path, config=CONFIG, project_name="p",
                      experiment_name="e", resume_step=2)
    tracker.log({"reward/mean": 0.5}, 3)
    tracker.close()
    lines = (tmp_path / "mine.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"project": "p", "experiment": "e", "steps": 4, "resume_step": 2}
    assert json.loads(lines[1]) == {"step": 3, "reward/mean": 0.5} and lines[2] == "finished"


@pytest.mark.parametrize(("name", "expected"), [
    ("missing.py:MyTracker", r"tracker file '.*missing.py' does not exist"),
    ("my_tracker.py:Absent", r"my_tracker.py defines no class 'Absent'; classes there: \['MyTracker', 'NoLog', 'OldSignature'\]"),
    ("my_tracker.py:NoLog", r"class NoLog has no log\(metrics, step\) method"),
    ("my_tracker.py:OldSignature", r"OldSignature\(config\) must accept the keyword arguments project_name, experiment_name, "
                                   r"config, log_dir, resume_step"),
])
def test_a_bad_tracker_class_is_named(tmp_path, name, expected):
    (tmp_path / "my_tracker.py").write_text(MY_TRACKER)
    path, _, cls = name.partition(":")
    with pytest.raises(TrackerError, match=rf"trainer.logger entry '.*{name}': .*{expected}"):
        Tracker([f"{tmp_path / path}:{cls}"], tmp_path)
