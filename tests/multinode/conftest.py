"""One multi-node Ray cluster (a head node of no CPUs, two worker nodes of 1 CPU) shared by the multi-node
tests of a session. It lives in its own process: this test process stays on the session's local cluster
(a process is connected to one cluster), and each multi-node driver runs as its own process."""

import pytest

from tests.multinode.cluster import HEAD_CPUS, WORKER_CPUS, MultiNodeCluster
from tests.reliability.conftest import small_assets  # noqa: F401 - the tiny model and data, built once

WORKER_NODES = 2


@pytest.fixture(scope="session")
def multinode_cluster(tmp_path_factory):
    log = tmp_path_factory.mktemp("multinode") / "cluster_host.log"
    cluster = MultiNodeCluster(HEAD_CPUS, [WORKER_CPUS] * WORKER_NODES, log)
    yield cluster
    cluster.stop()


@pytest.fixture
def restore_nodes(multinode_cluster):
    """For a test that removes nodes: adds worker nodes back afterwards, so the next test has two."""
    yield multinode_cluster
    while len(multinode_cluster.worker_nodes) < WORKER_NODES:
        multinode_cluster.request(op="add", num_cpus=WORKER_CPUS)
