"""The trainer stops cleanly on any failure: worker groups killed, placement groups removed, the error
propagated, checkpoints already written left whole. Runs `trainer.main.run` on the shared Ray cluster."""

import json
import os
import signal
import threading
import time

import psutil
import pytest
import ray

from single_controller import WorkerCallTimeout, WorkerDiedError
from tests.reliability.conftest import short_run
from trainer import checkpointing
from trainer.config_loader import load_config
from trainer.data import RLDataset
from trainer.main import run

pytestmark = pytest.mark.slow
ROLE_POOL_PREFIXES = ("all_roles_", "actor_", "critic_", "reward_model_")


def live_role_placement_groups() -> list[str]:
    table = ray.util.placement_group_table().values()
    return [pg["name"] for pg in table if pg["name"].startswith(ROLE_POOL_PREFIXES) and pg["state"] != "REMOVED"]


def role_workers() -> list[psutil.Process]:
    """The live colocated role workers of this process's Ray cluster (its raylet is our child); Ray may
    reuse an older idle process for them, so they are told apart by name, not start time."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.name().startswith("ray::Colocated") and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def assert_released(workers: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 15
    while live_role_placement_groups() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_role_placement_groups() == []
    _, alive = psutil.wait_procs(workers, timeout=max(1.0, deadline - time.monotonic()))
    assert alive == [], alive


def run_in_thread(cfg) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["history"] = run(cfg)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome["error"] = error
        outcome["ended"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_call_timeout_from_config_fails_the_build_and_releases_everything(ray_cluster, small_assets, tmp_path):
    cfg = load_config(short_run(small_assets, tmp_path, "trainer.call_timeout_s=0.01"))
    with pytest.raises(WorkerCallTimeout) as info:
        run(cfg)  # loading the model takes longer than 0.01 s
    message = str(info.value)
    assert "worker group 'roles.actor', method 'init_model' failed on rank(s) [0, 1]" in message
    assert "no result after 0.01s" in message
    assert_released(role_workers())


def test_worker_killed_mid_run_stops_the_run_within_seconds(ray_cluster, small_assets, tmp_path):
    cfg = load_config(short_run(small_assets, tmp_path, "trainer.total_training_steps=500", "trainer.save_at_end=false"))
    thread, outcome = run_in_thread(cfg)
    metrics = tmp_path / "logs" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and metrics.read_text().strip()) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert thread.is_alive(), outcome
    workers = role_workers()
    assert len(workers) == 2
    victim = next(w for w in workers if w.environ().get("RANK") == "1")
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)  # what the kernel's OOM killer does
    thread.join(timeout=60)
    assert not thread.is_alive(), "run() did not return after a worker was killed"
    assert outcome["ended"] - killed_at < 15
    error = outcome["error"]
    assert isinstance(error, WorkerDiedError), error
    message = str(error)
    assert "worker group 'roles.actor'" in message and f"pid {victim.pid})" in message and "rank 1 (node " in message
    assert "the worker process died (noticed in '" in message and "the call sent to it before was 'roles.actor." in message
    assert_released(workers)


def test_reward_error_mid_run_keeps_the_checkpoint_and_counts_filtered_prompts(ray_cluster, small_assets, tmp_path):
    # The reward function raises on its first call of step 2; step 1 was checkpointed before.
    rollouts_per_step = 16 * 8  # data.train_batch_size x rollout.n
    reward_file = tmp_path / "flaky_reward.py"
    reward_file.write_text(
        "calls = 0\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    global calls\n"
        "    calls += 1\n"
        f"    if calls > {rollouts_per_step}:\n"
        "        raise ValueError('scoring service unavailable')\n"
        "    return 0.0\n"
    )
    out = tmp_path / "run"
    cfg = load_config(short_run(
        small_assets, out, "trainer.total_training_steps=3", "trainer.save_freq=1",
        f"custom_reward_function.path={reward_file}", "data.max_prompt_length=45", "data.truncation=filter",
        "trainer.n_gpus_per_node=1",  # the reward runs on the driver: one rank shows the cleanup as two would
    ))
    with pytest.raises(RuntimeError, match=r"reward function failed on sample 0 \(data_source='synthetic/char_class'\): "
                                           r"ValueError: scoring service unavailable"):
        run(cfg)
    assert_released(role_workers())
    assert checkpointing.checkpoint_problem(out / "global_step_1") is None
    assert checkpointing.find_resume_dir(out, "auto") == out / "global_step_1"
    (record,) = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines()]
    from transformers import AutoTokenizer

    expected = RLDataset(small_assets["train"], AutoTokenizer.from_pretrained(small_assets["model"]), 45, truncation="filter")
    assert expected.num_filtered > 0
    assert record["step"] == 1 and record["data/filtered_prompts"] == expected.num_filtered
    assert record["data/truncated_prompts"] == 0 and record["data/prompts"] == 64 - expected.num_filtered
