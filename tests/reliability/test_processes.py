"""Whole training processes: kill -9 in the middle of a checkpoint save, then resume in a new process;
Ctrl-C in the driver. Each child starts its own Ray cluster (no RAY_ADDRESS)."""

import json
import signal
import time

import pytest

from tests.reliability.conftest import short_run
from tests.reliability.processes import ChildProcess
from trainer import checkpointing

pytestmark = pytest.mark.slow


def test_kill_9_during_save_then_resume_from_the_last_whole_step(small_assets, tmp_path):
    out = tmp_path / "ckpt"
    marker = tmp_path / "saving_step_2"
    overrides = short_run(small_assets, out, "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.max_ckpt_to_keep=2")
    first = ChildProcess(["-m", "tests.reliability.pause_in_save", "2", str(marker), *overrides], tmp_path / "first.log")
    try:
        first.wait_for(marker.exists, 180, "the save of step 2")
        partial = out / ".global_step_2.tmp"
        assert (partial / "actor").is_dir() and (partial / checkpointing.DRIVER_STATE_FILE).is_file()
        first.proc.send_signal(signal.SIGKILL)
        assert first.wait_exit(30) == -signal.SIGKILL
    finally:
        first.stop_leftovers(grace_s=2)  # Ray's agents outlive a SIGKILLed driver; end them
    # The previous checkpoint is whole; the interrupted one never became a global_step_N folder.
    assert checkpointing.checkpoint_problem(out / "global_step_1") is None
    assert not (out / "global_step_2").exists() and partial.is_dir()
    assert (out / checkpointing.LATEST_FILE).read_text() == "1"

    second = ChildProcess(["-m", "trainer.main", *overrides], tmp_path / "second.log")
    try:
        assert second.wait_exit(240) == 0, second.output[-4000:]
    finally:
        second.stop_leftovers()
    output = second.output
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
             "actor_rollout_ref.rollout.mode=async", "trainer.n_gpus_per_node=1")


@pytest.mark.parametrize(
    "extra, workers",
    [((), ("ray::Colocated",)), (ASYNC_RUN, ("ray::Colocated", "ray::VLLMRolloutWorker"))],
    ids=["sync", "async_vllm_stream"],
)
def test_ctrl_c_stops_the_run_and_its_ray_processes(small_assets, tmp_path, extra, workers):
    """Also while the rollout engines generate in their background thread (rollout.mode=async)."""
    overrides = short_run(small_assets, tmp_path / "out", "trainer.total_training_steps=500", "trainer.save_at_end=false", *extra)
    child = ChildProcess(["-m", "trainer.main", *overrides], tmp_path / "run.log")
    try:
        child.wait_for(lambda: "step 1:" in child.output, 180, "a finished step")
        names = child.live_descendant_names()
        for worker in workers:
            assert any(name.startswith(worker) for name in names), names
        interrupted_at = time.monotonic()
        child.proc.send_signal(signal.SIGINT)
        returncode = child.wait_exit(60)
        assert time.monotonic() - interrupted_at < 30
    finally:
        leftovers = child.stop_leftovers(grace_s=20)
    assert returncode != 0
    assert "interrupted: stopping the workers and releasing their placement groups" in child.output
    assert "KeyboardInterrupt" in child.output
    assert leftovers == [], f"processes of the interrupted run still alive: {leftovers}"
