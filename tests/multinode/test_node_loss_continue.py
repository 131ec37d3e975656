"""trainer.on_node_loss=continue: a node is lost mid-run and the run goes on, in the same job, on the node left,
from its newest whole checkpoint (saved by 2 ranks, loaded by 1); with on_node_join=grow it takes a node that
joins back at the next checkpoint (1 rank's checkpoint, 2 ranks). Every step is logged once, and the first step
after the loss equals a separate resume of that checkpoint on one node."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.multinode.cluster import WORKER_CPUS
from tests.multinode.trainer_runs import multinode_run, placed_nodes
from tests.reliability.conftest import short_run

pytestmark = pytest.mark.slow

# A checkpoint every step: wherever the loss is noticed (steps take about a second), the run resumes at most a
# step back and grows back at the next step's checkpoint with steps still to go.
STEPS = 5
SAVE_FREQ = 1
LOSS_AFTER_STEP = 1
STEP_TIMEOUT_S = 300
RUN_TIMEOUT_S = 600
CONTINUED = re.compile(r"continuing on 1 of 2 nodes \(trainer\.nnodes\) from checkpoint (\S*global_step_(\d+))")
# Per-step numbers that depend on every weight, every sampled token and the optimizer state.
COMPARED = ("actor/pg_loss", "actor/grad_norm", "reward/mean", "response/length_mean")


def logged_steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_the_run_continues_on_the_node_left_and_grows_back(restore_nodes, small_assets, tmp_path):
    cluster = restore_nodes
    run_dir = tmp_path / "run"
    run = multinode_run(
        small_assets, run_dir, f"trainer.total_training_steps={STEPS}", f"trainer.save_freq={SAVE_FREQ}",
        "trainer.on_node_loss=continue", "trainer.on_node_join=grow",
    )
    child = cluster.start_driver(run, tmp_path / "run.log")
    try:
        logged = f"step {LOSS_AFTER_STEP}: reward/mean="
        child.wait_for(lambda: logged in child.output, STEP_TIMEOUT_S, f"step {LOSS_AFTER_STEP}")
        _, victim = placed_nodes(child.output, cluster.worker_nodes)
        cluster.request(op="remove", node_id=victim)
        cluster.request(op="add", num_cpus=WORKER_CPUS)  # free at the first checkpoint after the loss
        returncode = child.wait_exit(RUN_TIMEOUT_S)
    finally:
        leftovers = child.stop_leftovers()
    output = child.output
    assert returncode == 0, output[-6000:]
    assert leftovers == []
    assert f"node {victim} (127.0.0.1) was lost (Ray: received SIGTERM); ranks [1] ran on it" in output, output[-6000:]
    checkpoint, resumed_step = CONTINUED.search(output).groups()
    assert LOSS_AFTER_STEP <= int(resumed_step) < STEPS - 1
    grown = re.search(r"growing from 1 to 2 of 2 nodes from checkpoint \S*global_step_(\d+)", output)
    assert grown and int(grown.group(1)) == int(resumed_step) + 1, output[-6000:]
    records = logged_steps(run_dir)
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))  # each step once, in order
    assert (run_dir / f"global_step_{STEPS}" / "MANIFEST.json").is_file()

    # The same checkpoint resumed by a run of its own on one node: its first step is the continued run's.
    first_after = int(resumed_step) + 1
    reference_dir = tmp_path / "reference"
    reference = cluster.start_driver(
        ["-m", "trainer.main", *short_run(
            small_assets, reference_dir, "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
            f"trainer.total_training_steps={first_after}", f"trainer.resume_mode={checkpoint}",
            "trainer.save_at_end=false",
        )],
        tmp_path / "reference.log",
    )
    try:
        assert reference.wait_exit(RUN_TIMEOUT_S) == 0, reference.output[-6000:]
    finally:
        assert reference.stop_leftovers() == []
    expected = logged_steps(reference_dir)[-1]
    continued = records[first_after - 1]
    assert expected["step"] == continued["step"] == first_after
    for key in COMPARED:
        assert continued[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key
