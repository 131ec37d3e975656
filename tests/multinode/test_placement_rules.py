"""The placement rules without a multi-node cluster: which rendezvous host rank 0 gets, the placement line,
local ranks when Ray packs two pool nodes onto one node, and how a lost node is reported."""

from ray.exceptions import ActorDiedError, ActorUnavailableError, ObjectReconstructionFailedError, RayTaskError

from single_controller import NodeLostError, WorkerDiedError, WorkerGroupError
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from single_controller.ray.node_loss import LostNode, node_may_be_lost
from single_controller.ray.placement import describe_placement, preset_master_addr
from single_controller.ray.waiting import _failure_error
from single_controller.worker import NodeInfo
from tests.multinode.workers import NodeProbe

NODE_A, NODE_B = "a" * 56, "b" * 56


def info(rank: int, node: str) -> NodeInfo:
    return NodeInfo(rank, node, "10.0.0.1" if node == NODE_A else "10.0.0.2", 100 + rank, ())


def test_rendezvous_host_is_loopback_on_one_node_only():
    assert preset_master_addr([NODE_A, NODE_A, NODE_A]) == "127.0.0.1"
    assert preset_master_addr([NODE_A, NODE_A, NODE_B, NODE_B]) is None  # rank 0 takes its node's address


def test_placement_line_groups_consecutive_ranks_per_node():
    ranks = [info(0, NODE_A), info(1, NODE_A), info(2, NODE_B), info(3, NODE_A)]
    assert describe_placement(ranks) == (
        f"ranks 0-1 on node {'a' * 12} (10.0.0.1), rank 2 on node {'b' * 12} (10.0.0.2), rank 3 on node {'a' * 12} (10.0.0.1)"
    )


def test_two_pool_nodes_packed_on_one_ray_node_share_local_ranks_and_loopback(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[1, 1], use_gpu=False)  # the session cluster has one node
    try:
        slots = pool.rank_slots()
        assert len(set(pool.node_ids())) == 1
        assert [(s.local_rank, s.local_world_size) for s in slots] == [(0, 2), (1, 2)]
        group = RayWorkerGroup(pool, RayClassWithInitArgs(NodeProbe), name_prefix="packed")
        envs = [rank["env"] for rank in group.where()]
        assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"] and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
        assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
        assert [r["sum"] for r in group.all_reduce_rank()] == [3.0, 3.0]
        group.kill()
    finally:
        pool.release()


def test_which_failures_wait_for_ray_to_declare_a_node_lost():
    peer_lost = RuntimeError("gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:2435")
    unreachable = ActorUnavailableError("RpcError: Socket closed", None)
    assert node_may_be_lost([peer_lost]) and node_may_be_lost([unreachable])
    assert not node_may_be_lost([ValueError("deliberate failure on rank 1")])
    assert not node_may_be_lost([peer_lost, ActorDiedError()])  # Ray knows a process died: no node to wait for
    lost_output = ObjectReconstructionFailedError("f91b78d7db9a6593bf6c7ddda0f9cf73cc95f86c0100000001000000")
    lost_input = RayTaskError("compute_log_prob", "Traceback ...", lost_output)  # a handed-over chunk was lost
    assert node_may_be_lost([lost_output]) and node_may_be_lost([lost_input])


def raised(message: str) -> RayTaskError:
    return RayTaskError("all_reduce", "Traceback ...", RuntimeError(message))


def describe(rank: int) -> str:
    return f"rank {rank} (node x, pid {100 + rank})"


def test_lost_node_error_names_the_node_and_every_rank_it_held():
    lost = [LostNode(NODE_B, "10.0.0.2", "received SIGTERM", (2, 3))]
    failures = {1: raised("Connection reset by peer")}
    error = _failure_error("probe", "all_reduce", failures, [0, 2, 3], describe, lambda rank: [], lost=lost)
    assert isinstance(error, NodeLostError) and isinstance(error, WorkerDiedError)
    assert error.ranks == [1, 2, 3] and error.lost_nodes == {NODE_B: [2, 3]}
    message = str(error)
    assert message.startswith("worker group 'probe', method 'all_reduce' failed on rank(s) [1, 2, 3]:\n")
    assert f"node {NODE_B} (10.0.0.2) was lost (Ray: received SIGTERM); ranks [2, 3] ran on it" in message
    assert "ranks [0] had not finished" in message  # the lost node's ranks are not listed as merely slow


def test_no_lost_node_keeps_the_plain_error():
    error = _failure_error("probe", "all_reduce", {1: raised("boom")}, [0], describe, lambda rank: [])
    assert type(error) is WorkerGroupError and error.ranks == [1]
