"""Whole training processes: kill -9 in the middle of a checkpoint save, then resume in a new process;
Ctrl-C in the driver. A child whose Ray processes the test checks starts its own Ray cluster (no RAY_ADDRESS);
the others attach to the session's cluster (RAY_ADDRESS), as on a machine with a cluster running: a cluster of
their own would only add Ray's start and stop."""

import json
import re
import signal
import time

import pytest

from tests.e2e.conftest import ONE_RANK
from tests.reliability.conftest import short_run
from tests.reliability.processes import ChildProcess
from trainer import checkpointing
from trainer.main import main

pytestmark = pytest.mark.slow


def test_kill_9_during_save_then_resume_from_the_last_whole_step(ray_cluster, small_assets, tmp_path, capsys):
    """The killed driver is attached to the session's cluster; the resume runs the command line's `main` in this
    test process, on that cluster: a new process to the killed one."""
    out = tmp_path / "ckpt"
    marker = tmp_path / "saving_step_2"
    overrides = short_run(
        small_assets, out, ONE_RANK, "trainer.total_training_steps=3", "trainer.save_freq=1",
        "trainer.max_ckpt_to_keep=2",
    )
    session = {"RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    first = ChildProcess(
        ["-m", "tests.reliability.pause_in_save", "2", str(marker), *overrides], tmp_path / "first.log", env=session
    )
    try:
        first.wait_for(marker.exists, 180, "the save of step 2")
        partial = out / ".global_step_2.tmp"
        assert (partial / "actor").is_dir() and (partial / checkpointing.DRIVER_STATE_FILE).is_file()
        first.proc.send_signal(signal.SIGKILL)
        assert first.wait_exit(30) == -signal.SIGKILL
    finally:
        first.stop_leftovers(grace_s=0)  # anything of its own left after a SIGKILL goes now; Ray ends its workers
    # The previous checkpoint is whole; the interrupted one never became a global_step_N folder.
    assert checkpointing.checkpoint_problem(out / "global_step_1") is None
    assert not (out / "global_step_2").exists() and partial.is_dir()
    assert (out / checkpointing.LATEST_FILE).read_text() == "1"

    capsys.readouterr()  # only the resumed run's output below
    code = main(overrides)
    output = "".join(capsys.readouterr())
    assert code == 0, output[-4000:]
    assert f"resumed from {out / 'global_step_1'} at step 1" in output
    assert "step 1:" not in output and "step 2:" in output and "step 3:" in output
    # Retention kept the newest two whole checkpoints; the killed save's leftovers were cleared.
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("global_step_", ".global_step_"))) == [
        "global_step_2", "global_step_3",
    ]
    assert all(checkpointing.checkpoint_problem(out / f"global_step_{s}") is None for s in (2, 3))
    steps = [json.loads(line)["step"] for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


ASYNC_RUN = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate",
             "actor_rollout_ref.rollout.async_training=true", "trainer.n_gpus_per_node=1")


def test_ctrl_c_stops_the_run_and_its_ray_processes(small_assets, tmp_path):
    """A run on a Ray cluster of its own, interrupted while the rollout engine generates in its background thread
    (rollout.async_training=true): Ctrl-C gives one line naming the step and the last checkpoint, no traceback, exit
    code 130, and leaves none of the cluster's processes, the trainer's and the engine's. (The synchronous loop's
    Ctrl-C, the same line and exit code, is test_ctrl_c_then_resume_logs_each_step_once_to_every_tracker; a
    synchronous run of its own here cost CI ~40 s and checked no other process's exit.)"""
    workers = ("ray::Colocated", "ray::VLLMRolloutWorker")
    out = tmp_path / "out"
    overrides = short_run(
        small_assets, out, "trainer.total_training_steps=500", "trainer.save_at_end=false", "trainer.save_freq=1", *ASYNC_RUN
    )
    child = ChildProcess(["-m", "trainer.main", *overrides], tmp_path / "run.log")
    try:
        # A hang guard, not a speed check: its own Ray cluster and a multi-process vLLM engine took over 180 s to
        # reach step 2 on a slow 2-core CI machine (2026-12-02), and the whole test 222 s with three test processes
        # beside CI's quick start (2026-12-04). One finished step: the engine is then generating the next batch in
        # its background thread, as at any later step.
        child.wait_for(lambda: "step 1:" in child.output, 600, "a finished step")
        names = child.live_descendant_names()
        for worker in workers:
            assert any(name.startswith(worker) for name in names), names
        interrupted_at = time.monotonic()
        child.proc.send_signal(signal.SIGINT)
        returncode = child.wait_exit(60)
        assert time.monotonic() - interrupted_at < 30
    finally:
        leftovers = child.stop_leftovers(grace_s=20)
    assert returncode == 130, child.output[-4000:]
    (line,) = [line for line in child.output.splitlines() if line.startswith("interrupted:")]
    stopped = re.fullmatch(r"interrupted: stopped at step (\d+); last checkpoint: (\S+) \(resume with the same command\)", line)
    assert stopped, line
    step, checkpoint = int(stopped.group(1)), stopped.group(2)
    assert step >= 1 and checkpoint == str(checkpointing.find_resume_dir(out, "auto").resolve()), line
    # Each step saves before it logs: Ctrl-C between the two leaves the checkpoint one step ahead of the log.
    assert checkpoint.endswith((f"global_step_{step}", f"global_step_{step + 1}")), line
    assert "Traceback" not in child.output and "KeyboardInterrupt" not in child.output, child.output[-4000:]
    assert leftovers == [], f"processes of the interrupted run still alive: {leftovers}"


def test_ctrl_c_then_resume_logs_each_step_once_to_every_tracker(ray_cluster, small_assets, tmp_path, monkeypatch):
    """Interrupted after logging step 3 with the checkpoint of step 2, then resumed: metrics.jsonl and
    TensorBoard hold each step once with the resumed run's values for 3 and 4; wandb (offline) and mlflow
    (its local store) continue the same run and received each step once (step 3 as first logged)."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.reliability import pausing_tracker
    from tests.trainer.wandb_offline import offline_runs
    from trainer.config_loader import load_config
    from trainer.main import run

    out = tmp_path / "out"
    logs = out / "logs"
    trackers = f"trainer.logger=[console,jsonl,tensorboard,wandb,mlflow,{pausing_tracker.__file__}:PausingTracker]"
    small = ("trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2")
    overrides = short_run(small_assets, out, "trainer.total_training_steps=4", "trainer.save_freq=2", trackers, *small)
    for name in ("WANDB_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    session = {"RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    child = ChildProcess(
        ["-m", "trainer.main", *overrides], tmp_path / "run.log", env={"WANDB_MODE": "offline", **session}
    )
    try:
        child.wait_for((logs / pausing_tracker.PAUSED_MARKER).exists, 240, "step 3 logged")
        child.proc.send_signal(signal.SIGINT)
        assert child.wait_exit(60) == 130
    finally:
        child.stop_leftovers(grace_s=20)
    checkpoint = (out / "global_step_2").resolve()
    assert f"interrupted: stopped at step 3; last checkpoint: {checkpoint} (resume with the same command)" in child.output
    assert "Traceback" not in child.output
    stopped = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in stopped] == [1, 2, 3] and checkpointing.find_resume_dir(out, "auto") == out / "global_step_2"

    monkeypatch.setenv("WANDB_MODE", "offline")
    resumed = run(load_config(overrides))
    assert [r["step"] for r in resumed] == [3, 4]
    records = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert records == stopped[:2] + resumed  # steps 3 and 4 as the resumed run logged them, once
    received = [json.loads(line) for line in (logs / pausing_tracker.RECEIVED_FILE).read_text().splitlines()]
    assert [r.get("step", r.get("resume_step")) for r in received] == [None, 1, 2, 3, 2, 3, 4]  # resume_step: None, then 2

    events = EventAccumulator(str(logs / "tensorboard"))
    events.Reload()
    wall = [(e.step, e.value) for e in events.Scalars("timing/wall_step_s")]
    assert [step for step, _ in wall] == [1, 2, 3, 4]
    assert [value for _, value in wall] == pytest.approx([r["timing/wall_step_s"] for r in stopped[:2] + resumed])

    wandb_id = json.loads((logs / "wandb_run.json").read_text())["run_id"]
    runs = offline_runs(logs / "wandb", wandb_id)
    assert [[h["_step"] for h in r["history"]] for r in runs] == [[1, 2, 3], [4]]
    assert runs[0]["config"]["trainer"]["total_training_steps"] == 4

    mlflow_id = json.loads((logs / "mlflow_run.json").read_text())["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{logs / 'mlflow.db'}")
    points = [(m.step, m.value) for m in client.get_metric_history(mlflow_id, "timing/wall_step_s")]
    assert points == [(r["step"], r["timing/wall_step_s"]) for r in stopped + resumed[1:]]
    assert client.get_run(mlflow_id).data.params["trainer.save_freq"] == "2"
