"""`python -m trainer.main trainer.nnodes=2 trainer.n_gpus_per_node=1` attached to the multi-node cluster
(RAY_ADDRESS) runs to the end with a worker process on each worker node (two per node: the placement tests)."""

import pytest

from tests.multinode.trainer_runs import multinode_run, placed_nodes

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 900


def test_trainer_runs_to_the_end_on_two_nodes(multinode_cluster, small_assets, tmp_path):
    child = multinode_cluster.start_driver(multinode_run(small_assets, tmp_path / "run"), tmp_path / "run.log")
    try:
        returncode = child.wait_exit(RUN_TIMEOUT_S)
    finally:
        leftovers = child.stop_leftovers()
    output = child.output
    assert returncode == 0, output[-6000:]
    assert "step 1: reward/mean=" in output and "step 2: reward/mean=" in output, output[-4000:]
    nodes = placed_nodes(output, multinode_cluster.worker_nodes)
    assert sorted(nodes) == sorted(multinode_cluster.worker_nodes)  # one pool node on each worker node
    assert (tmp_path / "run" / "global_step_2" / "MANIFEST.json").is_file()
    assert leftovers == []
