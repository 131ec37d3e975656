"""Groups sharing a pool, colocated roles, detached groups re-attached from another driver process."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from tests.conftest import REPO_ROOT
from tests.single_controller.workers import ActorRole, EchoWorker, RefRole, make_batch


def test_two_groups_share_one_pool(cpu_pool_2):
    a = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker, offset=1), name_prefix="share_a")
    b = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker, offset=2), name_prefix="share_b")
    pids_a, pids_b = {o["pid"] for o in a.whoami()}, {o["pid"] for o in b.whoami()}
    assert len(pids_a) == len(pids_b) == 2 and not pids_a & pids_b
    # Rank r of both groups lives on the same slot (same placement group bundle).
    assert [i.node_id for i in a.node_info] == [i.node_id for i in b.node_info]
    assert torch.equal(a.plus_offset(make_batch(3)).batch["y"], torch.arange(3) + 1)
    assert torch.equal(b.plus_offset(make_batch(3)).batch["y"], torch.arange(3) + 2)


def test_groups_requested_together_start_side_by_side(cpu_pool_2):
    a = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker, offset=1), name_prefix="side_a", wait_started=False)
    b = RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker, offset=2), name_prefix="side_b", wait_started=False)
    assert a.node_info == [] and b.node_info == []  # not waited for yet
    assert b.wait_started() is b and a.wait_started() is a and a.wait_started() is a  # any order, more than once
    assert len(a.node_info) == len(b.node_info) == 2 and "ranks 0-1 on node" in a.describe_placement()
    assert torch.equal(a.plus_offset(make_batch(3)).batch["y"], torch.arange(3) + 1)
    assert torch.equal(b.plus_offset(make_batch(3)).batch["y"], torch.arange(3) + 2)


def test_colocated_roles_share_one_process_per_slot(cpu_pool_2):
    cls = create_colocated_worker_cls({"actor": RayClassWithInitArgs(ActorRole, lr=0.5), "ref": RefRole})
    group = RayWorkerGroup(cpu_pool_2, cls, name_prefix="colocated")
    roles = group.spawn()
    assert set(roles) == {"actor", "ref"}
    actor, ref = roles["actor"], roles["ref"]
    actor_info, ref_info = actor.describe(), ref.describe()
    assert [i["role"] for i in actor_info] == ["actor", "actor"] and actor_info[0]["lr"] == 0.5
    assert [i["pid"] for i in actor_info] == [i["pid"] for i in ref_info]
    assert [i["rank"] for i in ref_info] == [0, 1]
    data = make_batch(5)
    assert torch.allclose(actor.score(data).batch["score"], torch.arange(5).float() * 0.5)
    # A role declares its own mesh; mesh dispatch goes through the role's instance.
    assert ref.init_mesh() == [0, 1]
    assert torch.equal(ref.ref_score(data).batch["ref"], -torch.arange(5).float())
    with pytest.raises(ValueError, match="unknown roles"):
        group.spawn({"critic"})


_SECOND_DRIVER = textwrap.dedent(
    """
    import json, sys, ray
    from single_controller.ray import RayWorkerGroup
    from tests.single_controller.workers import EchoWorker, make_batch
    ray.init(address=sys.argv[1])
    group = RayWorkerGroup.from_detached("detached_echo", EchoWorker)
    out = group.plus_offset(make_batch(4))
    print(json.dumps({"world_size": group.world_size, "y": out.batch["y"].tolist(),
                      "pids": [o["pid"] for o in group.whoami()]}))
    """
)


def test_detached_group_reattached_from_second_driver(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, detached=True, name_prefix="detached_")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker, offset=7), name_prefix="detached_echo", detached=True)
    try:
        pids = [o["pid"] for o in group.whoami()]
        address = ray_cluster.get_runtime_context().gcs_address
        result = subprocess.run(
            [sys.executable, "-c", _SECOND_DRIVER, address],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen == {"world_size": 2, "y": [7, 8, 9, 10], "pids": pids}
    finally:
        group.kill()
        pool.release()


def test_attach_to_missing_detached_group_is_clear(ray_cluster):
    with pytest.raises(LookupError, match="no detached worker group named 'nope'"):
        RayWorkerGroup.from_detached("nope", EchoWorker)


def test_detached_group_requires_detached_pool(cpu_pool_2):
    with pytest.raises(ValueError, match="detached pool"):
        RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(EchoWorker), name_prefix="x", detached=True)


def test_worker_class_must_subclass_worker(cpu_pool_2):
    class NotAWorker:
        pass

    with pytest.raises(TypeError, match="must subclass single_controller.Worker"):
        RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(NotAWorker))
