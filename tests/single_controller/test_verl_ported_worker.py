"""A worker ported from verl's TensorDict-era workers, on a real worker group of 2: TensorDicts through the
data-parallel modes and a mesh, the outer/inner set_dispatch_collect pattern, async methods, the worker
environment (RAY_LOCAL_WORLD_SIZE, worker_env) and save / restore of DISPATCH_MODE_FN_REGISTRY.
Expected values follow verl 0.9.1's semantics, written by hand."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from protocol import DataProto
from single_controller import WorkerGroupError
from single_controller.base.decorator import DISPATCH_MODE_FN_REGISTRY, Dispatch
from single_controller.dispatch import resolve_dispatch
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.single_controller.verl_style_workers import PortedWorker, TutorialGenerator

ENV_NAMES = ["RANK", "RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE", "WG_BACKEND", "WG_PREFIX", "PORT_FLAG", "FROM_OPTIONS"]


@pytest.fixture(scope="module")
def ported(cpu_pool_2):
    cia = RayClassWithInitArgs(PortedWorker)
    cia.update_options({"runtime_env": {"env_vars": {"FROM_OPTIONS": "yes"}}})
    group = RayWorkerGroup(cpu_pool_2, cia, name_prefix="verl_ported", worker_env={"PORT_FLAG": "on"})
    yield group
    group.kill()


def agent_rows(n: int = 5) -> TensorDict:
    scores = [[], [0.5], [0.1, 0.2], [{"acc": 1.0}], [[1], [2], [3]]][:n]
    data = DataProto.from_dict({"x": torch.arange(n)}, {"turn_scores": scores}, meta_info={"temperature": 0.7})
    return data.to_tensordict()


def test_dp_compute_proto_splits_a_tensordict_and_concatenates_the_outputs(ported):
    out = ported.score_td(agent_rows(5))  # 5 rows over 2 workers: padded to 6, the padding row stripped
    assert isinstance(out, TensorDict) and out.batch_size == (5,)
    assert out["doubled"].tolist() == [0, 2, 4, 6, 8]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]
    assert out["turns"].tolist() == [0, 1, 2, 1, 3]  # each worker read its rows' nested lists
    back = DataProto.from_tensordict(out)
    assert back.meta_info == {"temperature": 0.7} and back.batch["doubled"].tolist() == [0, 2, 4, 6, 8]
    # DP_COMPUTE_METRIC splits the same way (each worker sees 3 rows, one of rank 1's is padding) and keeps a list
    assert ported.count_rows_td(agent_rows(5)) == [{"rank": 0, "rows": 3}, {"rank": 1, "rows": 3}]


def test_mesh_set_from_an_inner_engine_dispatches_a_tensordict(ported):
    infos = ported.dispatch_collect_info()
    assert infos == [
        {"dispatch_dp_rank": {"actor": 0}, "collect_dp_rank": {"actor": True}},
        {"dispatch_dp_rank": {"actor": 0}, "collect_dp_rank": {"actor": False}},
    ]
    assert ported._query_dispatch_info("actor") == [0, 0]
    assert ported.execute_all_sync("query_collect_info", "actor") == [True, False]
    out = ported.compute_on_mesh(agent_rows(3))  # one DP rank: both workers get all rows, rank 0's output is kept
    assert out["x"].tolist() == [0, 1, 2] and out["producer"].tolist() == [0, 0, 0]
    with pytest.raises(WorkerGroupError, match="mesh 'actor' is already registered"):
        ported.set_again()
    with pytest.raises(WorkerGroupError, match=r"set_dispatch_collect\('other'\) needs one DP rank"):
        ported.set_conflicting()


def test_async_registered_methods_are_awaited_on_the_worker(ported):
    assert ported.async_identity("v") == [{"rank": 0, "value": "v"}, {"rank": 1, "value": "v"}]
    out = ported.async_double(DataProto.from_dict({"x": torch.arange(5)}))
    assert out.batch["y"].tolist() == [0, 2, 4, 6, 8] and out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    results = ported.async_identity("later")  # blocking=True: a plain result, like the sync methods
    assert [item["value"] for item in results] == ["later", "later"]
    with pytest.raises(TypeError, match=r"got TensorDict with batch_size \[\] \(it needs a batch dimension to split\)"):
        ported.score_td(TensorDict({"x": torch.zeros(2)}, batch_size=[]))


def test_workers_see_the_group_env_and_the_users_env(ported):
    envs = ported.environment(ENV_NAMES)
    for rank, env in enumerate(envs):
        assert env == {
            "RANK": str(rank),
            "RAY_LOCAL_RANK": str(rank),
            "RAY_LOCAL_WORLD_SIZE": "2",
            "WG_BACKEND": "ray",
            "WG_PREFIX": "verl_ported",
            "PORT_FLAG": "on",
            "FROM_OPTIONS": "yes",
        }


def test_user_env_may_not_override_the_groups_variables(cpu_pool_2):
    with pytest.raises(ValueError, match=r"worker_env cannot override protected system env \['RANK'\]"):
        RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(PortedWorker), worker_env={"RANK": "3"})
    cia = RayClassWithInitArgs(PortedWorker)
    cia.update_options({"runtime_env": {"env_vars": {"MASTER_PORT": "1234"}}})
    with pytest.raises(ValueError, match=r"update_options cannot override protected system env \['MASTER_PORT'\]"):
        RayWorkerGroup(cpu_pool_2, cia)
    with pytest.raises(TypeError, match=r"must be str, got \{'N': 'int'\}"):
        RayWorkerGroup(cpu_pool_2, RayClassWithInitArgs(PortedWorker), worker_env={"N": 1})


def _count_outputs(worker_group, outputs):
    return len(outputs)


def test_registry_copy_and_restore_round_trip_through_real_groups(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=False)
    original = resolve_dispatch(Dispatch.DP_COMPUTE_PROTO)
    saved = DISPATCH_MODE_FN_REGISTRY.copy()
    data = DataProto.from_dict({"x": torch.arange(4)})
    try:
        assert isinstance(saved, dict) and saved[Dispatch.DP_COMPUTE_PROTO] == DISPATCH_MODE_FN_REGISTRY[Dispatch.DP_COMPUTE_PROTO]
        DISPATCH_MODE_FN_REGISTRY[Dispatch.DP_COMPUTE_PROTO] = {
            "dispatch_fn": saved[Dispatch.DP_COMPUTE_PROTO]["dispatch_fn"],
            "collect_fn": _count_outputs,
        }
        DISPATCH_MODE_FN_REGISTRY["VERL_PORTED_TEMP"] = {"dispatch_fn": print, "collect_fn": print}
        assert Dispatch.VERL_PORTED_TEMP == "VERL_PORTED_TEMP" and len(DISPATCH_MODE_FN_REGISTRY) == len(saved) + 1
        changed = RayWorkerGroup(pool, RayClassWithInitArgs(TutorialGenerator), name_prefix="registry_changed")
        try:
            assert changed.infer(data) == 1  # the replaced collect function counted the one worker's output
        finally:
            changed.kill()
    finally:
        DISPATCH_MODE_FN_REGISTRY.clear()
        DISPATCH_MODE_FN_REGISTRY.update(saved)
    assert resolve_dispatch(Dispatch.DP_COMPUTE_PROTO) == original  # the whole entry is back, hand-off included
    assert "VERL_PORTED_TEMP" not in DISPATCH_MODE_FN_REGISTRY and dict(DISPATCH_MODE_FN_REGISTRY) == saved
    with pytest.raises(AttributeError, match="Dispatch has no mode 'VERL_PORTED_TEMP'"):
        Dispatch.VERL_PORTED_TEMP
    restored = RayWorkerGroup(pool, RayClassWithInitArgs(TutorialGenerator), name_prefix="registry_restored")
    try:
        assert restored.infer(data).batch["ref_log_prob"].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
    finally:
        restored.kill()
        pool.release()
