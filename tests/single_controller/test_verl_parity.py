"""verl single-controller names a port relies on, on real worker groups: mesh registration and the nd
dispatch dict, registered and updated dispatch modes, the registry, execute_* helpers, fused workers,
parallel_put and the verl import paths (docs/migrating_from_verl.md lists them)."""

from __future__ import annotations

import pytest
import ray
import torch

from protocol import DataProto
from single_controller import ClassWithInitArgs, DispatchError, ResourcePool, WorkerGroup, WorkerGroupError
from single_controller.base.decorator import (
    DISPATCH_MODE_FN_REGISTRY,
    Dispatch,
    get_predefined_dispatch_fn,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)
from single_controller.dispatch import resolve_dispatch
from single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
    parallel_put,
)
from single_controller.ray.colocated import ColocatedWorker
from tests.single_controller.verl_style_workers import ActorRole, CriticRole, MeshWorker


@pytest.fixture(scope="module")
def mesh_group(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[4], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(MeshWorker, offset=100), name_prefix="verl_mesh")
    yield group
    group.kill()
    pool.release()


def test_registered_mesh_splits_over_dp_and_collects_one_rank_per_dp_group(mesh_group):
    assert mesh_group._query_dispatch_info("train") == [0, 0, 1, 1]
    assert mesh_group._query_collect_info("train") == [True, False, True, False]
    out = mesh_group.compute(DataProto.from_dict({"x": torch.arange(5)}))
    assert out.batch["x"].tolist() == [0, 1, 2, 3, 4]  # padded to 6 over 2 DP ranks, padding stripped
    assert out.batch["producer"].tolist() == [0, 0, 0, 2, 2]  # collected from ranks 0 and 2
    with pytest.raises(WorkerGroupError, match="has not declared mesh 'nope'.*_register_dispatch_collect_info"):
        mesh_group._query_dispatch_info("nope")


def test_mode_registered_by_name_and_built_on_the_registry(mesh_group):
    assert Dispatch.VERL_PARITY_SUM == "VERL_PARITY_SUM"
    assert mesh_group.add_offset(DataProto.from_dict({"x": torch.arange(6)})) == sum(range(6)) + 6 * 100
    with pytest.raises(AssertionError, match="already exists"):
        register_dispatch_mode("VERL_PARITY_SUM", print, print)
    with pytest.raises(DispatchError, match="already exists"):
        register_dispatch_mode("ONE_TO_ALL", print, print)
    with pytest.raises(AttributeError, match="Dispatch has no mode 'NOT_REGISTERED'"):
        Dispatch.NOT_REGISTERED


def test_update_dispatch_mode_applies_to_groups_created_afterwards(ray_cluster):
    name = register_dispatch_mode("VERL_PARITY_UPDATED", lambda wg, x: [x] * wg.world_size, lambda wg, outs: outs)
    update_dispatch_mode(Dispatch.VERL_PARITY_UPDATED, lambda wg, x: [x + r for r in range(wg.world_size)], lambda wg, outs: sum(outs))
    assert resolve_dispatch(name).collect_fn(None, [1, 2, 3]) == 6
    assert resolve_dispatch(name).dispatch_fn(WorkerGroupSize(3), 10) == [10, 11, 12]
    with pytest.raises(AssertionError, match="'NEVER_REGISTERED' is not registered"):
        update_dispatch_mode("NEVER_REGISTERED", print, print)
    with pytest.raises(DispatchError, match=r"must be a dict with exactly the keys \['dispatch_fn', 'collect_fn'\]"):
        DISPATCH_MODE_FN_REGISTRY[Dispatch.ONE_TO_ALL] = {}
    pair = get_predefined_dispatch_fn(Dispatch.ONE_TO_ALL)
    assert set(pair) == {"dispatch_fn", "collect_fn"} and Dispatch.ONE_TO_ALL in DISPATCH_MODE_FN_REGISTRY
    assert "VERL_PARITY_UPDATED" in DISPATCH_MODE_FN_REGISTRY and "NEVER_REGISTERED" not in DISPATCH_MODE_FN_REGISTRY
    with pytest.raises(KeyError, match="'NEVER_REGISTERED' is not registered"):
        DISPATCH_MODE_FN_REGISTRY["NEVER_REGISTERED"]
    del DISPATCH_MODE_FN_REGISTRY[Dispatch.VERL_PARITY_UPDATED]
    assert name not in DISPATCH_MODE_FN_REGISTRY


class WorkerGroupSize:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size


def test_execute_all_and_rank_zero_sync_and_async(mesh_group):
    refs = mesh_group.execute_all_async("whoami", "t")
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert [o["rank"] for o in ray.get(refs)] == [0, 1, 2, 3]
    assert mesh_group.execute_all_sync("plus_rank", [1, 2, 3, 4]) == [1, 3, 5, 7]  # all lists of 4: split
    assert mesh_group.execute_all_sync("plus_rank", [1, 2, 3, 4], scale=[1, 1, 1, 2]) == [1, 3, 5, 14]
    # not every argument is a per-rank list: every rank gets the arguments as they are
    assert mesh_group.execute_all_sync("plain_method", 5) == [50, 51, 52, 53]
    assert mesh_group.execute_all("plain_method", 1) == [10, 11, 12, 13]
    ref = mesh_group.execute_rank_zero_async("whoami", "z")
    assert isinstance(ref, ray.ObjectRef) and ray.get(ref)["tag"] == "z"
    assert mesh_group.execute_rank_zero_sync("plain_method", 2) == 20
    assert mesh_group.execute_rank_zero("plain_method", 3) == 30


def test_fused_worker_roles_see_each_other_and_fuw_execute_reaches_any_method(ray_cluster):
    raw = create_colocated_worker_raw_cls(
        {"actor": RayClassWithInitArgs(ActorRole, lr=0.5), "critic": RayClassWithInitArgs(CriticRole)}
    )
    assert isinstance(raw, type) and hasattr(raw, "_fuw_execute")
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(raw), name_prefix="verl_fused")
    fused_cia = create_colocated_worker_cls_fused({"actor": ActorRole, "critic": CriticRole})
    assert isinstance(fused_cia, RayClassWithInitArgs) and issubclass(fused_cia.cls, ColocatedWorker)
    assert issubclass(create_colocated_worker_cls({"actor": ActorRole}).cls, ColocatedWorker)
    try:
        fn = group.fused_worker_execute_fn_name
        assert group.execute_all_sync(fn, "actor_fwmn_learning_rate") == [0.5, 0.5]
        group.fuse(["actor", "critic"])
        actor, critic = group.actor.describe(), group.critic.describe()
        assert [a["critic_value"] for a in actor] == [7, 7]
        assert [a["pid"] for a in actor] == [c["pid"] for c in critic]  # one process per rank holds both roles
        assert group.actor.scaled_lr(3) == [1.5, 1.5]  # an async role method, awaited inside the fused actor
        with pytest.raises(ValueError, match="cannot fuse role 'actor'"):
            group.fuse(["actor"])
        with pytest.raises(WorkerGroupError, match="needs '<role>_fwmn_<method>'"):
            group.execute_rank_zero_sync(fn, "learning_rate")
    finally:
        group.kill()
        pool.release()


def test_parallel_put_keeps_order(ray_cluster):
    values = [torch.full((1000,), i) for i in range(20)]
    refs = parallel_put(values, max_workers=4)
    assert [int(t[0]) for t in ray.get(refs)] == list(range(20))
    with pytest.raises(AssertionError, match="at least one"):
        parallel_put([])


def test_verl_import_paths_resolve_to_the_project_classes():
    from single_controller import Worker
    from single_controller.base import Worker as BaseWorker
    from single_controller.base.worker import Worker as ModuleWorker
    from single_controller.base.worker_group import WorkerGroup as ModuleWorkerGroup
    from single_controller.ray.base import RayWorkerGroup as BaseRayWorkerGroup

    assert BaseWorker is ModuleWorker is Worker
    assert WorkerGroup is ModuleWorkerGroup is BaseRayWorkerGroup is RayWorkerGroup
    assert ClassWithInitArgs is RayClassWithInitArgs and ResourcePool is RayResourcePool
    assert callable(register)
