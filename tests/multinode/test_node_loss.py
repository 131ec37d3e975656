"""A node lost mid-run: the driver stops in bounded time with an error naming the node and the ranks it
held, and no worker process is left. Once through the trainer (node shut down: Ray knows at once), once
through a worker group in a gloo collective (node killed: Ray knows after its health check), once through a
worker group whose outputs were ready but not yet fetched (the lost node's output went with it)."""

import time

import psutil
import pytest

from single_controller.ray.node_loss import NODE_LOSS_WAIT_S
from tests.multinode.cluster import driver_script, tagged_json
from tests.multinode.trainer_runs import multinode_run, placed_nodes

pytestmark = pytest.mark.slow

FIRST_STEP_TIMEOUT_S = 600
# From the node's removal to the driver's exit: the driver raises within seconds of Ray declaring the node
# dead, then stops the workers; the margin is for a busy machine.
EXIT_AFTER_LOSS_S = 180
WORKERS_GONE_S = 60


def test_node_lost_mid_run_names_the_node_and_its_ranks(restore_nodes, small_assets, tmp_path):
    cluster = restore_nodes
    run = multinode_run(small_assets, tmp_path / "run", "trainer.total_training_steps=100", "trainer.save_at_end=false")
    child = cluster.start_driver(run, tmp_path / "run.log")
    try:
        child.wait_for(lambda: "step 1: reward/mean=" in child.output, FIRST_STEP_TIMEOUT_S, "the first step")
        _, victim = placed_nodes(child.output, cluster.worker_nodes)
        workers = cluster.actor_processes()
        assert len(workers) == 2, [p.cmdline() for p in workers]  # one rank on each worker node
        cluster.request(op="remove", node_id=victim)
        removed_at = time.monotonic()
        returncode = child.wait_exit(EXIT_AFTER_LOSS_S)
        exit_s = time.monotonic() - removed_at
    finally:
        leftovers = child.stop_leftovers()
    output = child.output
    assert returncode != 0, output[-6000:]
    assert "NodeLostError" in output, output[-6000:]
    assert f"node {victim} (127.0.0.1) was lost (Ray: received SIGTERM); ranks [1] ran on it" in output, output[-6000:]
    assert exit_s < EXIT_AFTER_LOSS_S
    _, alive = psutil.wait_procs(workers, timeout=WORKERS_GONE_S)
    assert alive == [], f"worker processes left after the driver stopped: {[p.pid for p in alive]}"
    assert leftovers == []


def lose_a_node_under_the_driver(cluster, scenario: str, victim_rank: int, graceful: bool, tmp_path):
    """Run node_loss_driver.py's `scenario`; once it prints its placement, remove the node of `victim_rank`.
    Returns the driver's RESULT, the victim node, when it was removed, and the worker processes before."""
    child = cluster.start_driver([driver_script("node_loss_driver.py"), scenario], tmp_path / "driver.log")
    try:
        child.wait_for(lambda: "PLACED " in child.output, FIRST_STEP_TIMEOUT_S, "the scenario under way")
        nodes = tagged_json(child.output, "PLACED ")
        victim = nodes[victim_rank]
        assert nodes[0] != victim
        workers = cluster.actor_processes()
        removed_at = time.time()
        cluster.request(op="remove", node_id=victim, graceful=graceful)
        returncode = child.wait_exit(EXIT_AFTER_LOSS_S)
    finally:
        leftovers = child.stop_leftovers()
    result = tagged_json(child.output, "RESULT ")
    assert returncode == 0 and result, child.output[-6000:]
    assert leftovers == []
    assert result["error"] == "NodeLostError", result
    return result, victim, removed_at, workers


def test_node_killed_abruptly_is_named_after_rays_health_check(restore_nodes, tmp_path):
    """SIGKILL of the node's raylet (a machine gone): the surviving ranks see their gloo peers vanish at
    once, before Ray knows; the driver waits (bounded) for Ray to declare the node dead, then names it."""
    result, victim, removed_at, workers = lose_a_node_under_the_driver(
        restore_nodes, "collective", victim_rank=2, graceful=False, tmp_path=tmp_path
    )
    assert result["lost_nodes"] == {victim: [2, 3]} and set(result["ranks"]) >= {2, 3}, result
    assert f"node {victim} (127.0.0.1) was lost (Ray: health check failed" in result["message"], result["message"]
    assert result["raised_at"] - removed_at < NODE_LOSS_WAIT_S + 30  # Ray's detection, then at most the bounded wait
    _, alive = psutil.wait_procs(workers, timeout=WORKERS_GONE_S)
    assert alive == [], f"worker processes left after the driver stopped: {[p.pid for p in alive]}"


def test_output_lost_with_its_node_before_the_fetch_is_a_node_loss(restore_nodes, tmp_path):
    """Every rank returned, then the node holding rank 1's output (in its object store) is shut down before
    the driver fetched it: the fetch names the node and the rank, as a loss during the call does (the error
    trainer.on_node_loss=continue acts on), instead of Ray's object-reconstruction error."""
    result, victim, _, _ = lose_a_node_under_the_driver(
        restore_nodes, "lost_output", victim_rank=1, graceful=True, tmp_path=tmp_path
    )
    assert result["lost_nodes"] == {victim: [1]} and result["ranks"] == [1], result
    assert f"node {victim} (127.0.0.1) was lost (Ray: received SIGTERM); ranks [1] ran on it" in result["message"]
    assert "its output was lost after 'output_of' returned" in result["message"], result["message"]
