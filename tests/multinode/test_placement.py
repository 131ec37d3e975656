"""Worker groups over two Ray nodes: ranks fill the nodes in order, the rendezvous is rank 0's node,
gloo all-reduces across the nodes, and colocated roles and separate groups are placed the same way.
One driver (tests/multinode/placement_driver.py) runs every case on the shared multi-node cluster."""

import pytest

from tests.multinode.cluster import driver_script, listening_addresses

pytestmark = pytest.mark.slow

DRIVER_TIMEOUT_S = 600
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


@pytest.fixture(scope="module")
def placed(multinode_cluster):
    result, _ = multinode_cluster.run_driver([driver_script("placement_driver.py")], DRIVER_TIMEOUT_S)
    return result, multinode_cluster.worker_nodes


def nodes_of(where):
    return [rank["node_id"] for rank in where]


def assert_two_ranks_per_worker_node(where, worker_nodes):
    nodes = nodes_of(where)
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2], nodes
    assert sorted({nodes[0], nodes[2]}) == sorted(worker_nodes), (nodes, worker_nodes)


def test_ranks_fill_the_nodes_in_order(placed):
    result, worker_nodes = placed
    group = result["one_group"]
    assert_two_ranks_per_worker_node(group["where"], worker_nodes)
    assert group["pool_nodes"] == [nodes_of(group["where"])[0], nodes_of(group["where"])[2]]
    envs = [rank["env"] for rank in group["where"]]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"] and {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    first, second = nodes_of(group["where"])[0], nodes_of(group["where"])[2]
    ip = result["node_ips"]
    assert group["placement"] == f"ranks 0-1 on node {first[:12]} ({ip[first]}), ranks 2-3 on node {second[:12]} ({ip[second]})"


def test_rendezvous_is_rank0_node_and_gloo_all_reduces_across_nodes(placed):
    result, _ = placed
    group = result["one_group"]
    rank0_node = group["where"][0]["node_id"]
    assert group["preset_master_addr"] is None  # ranks on two nodes: rank 0 takes its own node's address
    envs = [rank["env"] for rank in group["where"]]
    assert {e["MASTER_ADDR"] for e in envs} == {result["node_ips"][rank0_node]}
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and int(envs[0]["MASTER_PORT"]) > 0
    for rank in group["all_reduce"]:
        assert rank["sum"] == 1 + 2 + 3 + 4  # each rank adds rank + 1
        assert rank["nodes"] == nodes_of(group["where"])  # every rank gathered every rank's node


def test_colocated_roles_share_one_process_per_rank_across_nodes(placed):
    result, worker_nodes = placed
    colocated = result["colocated_roles"]
    assert_two_ranks_per_worker_node(colocated["first"], worker_nodes)
    assert [r["pid"] for r in colocated["first"]] == [r["pid"] for r in colocated["second"]]
    assert len({r["pid"] for r in colocated["first"]}) == 4
    assert [r["sum"] for r in colocated["all_reduce"]] == [10.0] * 4


def test_separate_groups_each_span_two_nodes(placed):
    result, _ = placed
    separate = result["separate_groups"]
    for where, reduced in zip(separate["where"], separate["all_reduce"]):
        nodes = nodes_of(where)  # pool [1, 1]: one rank on each of two nodes
        assert len(set(nodes)) == 2 and set(nodes) <= set(result["node_ips"]), nodes
        assert [r["sum"] for r in reduced] == [3.0, 3.0]
        assert {r["env"]["MASTER_ADDR"] for r in where} == {result["node_ips"][nodes[0]]}
    pids = [{r["pid"] for r in where} for where in separate["where"]]
    assert pids[0].isdisjoint(pids[1])  # separate placement: each group has processes of its own
    ports = [{r["env"]["MASTER_PORT"] for r in where} for where in separate["where"]]
    assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1]


def test_every_node_listens_on_loopback_only(multinode_cluster, placed):
    listeners = listening_addresses(multinode_cluster.host.pid)
    names = {name for name, _ in listeners}
    assert {"gcs_server", "raylet"} <= names, listeners
    exposed = {entry for entry in listeners if entry[1] not in LOOPBACK}
    assert exposed == set(), f"listening beyond loopback: {exposed}"
