"""The dispatch of the FSDP workers' Ulysses layout on 4 ranks with k=2: the batch is split over the 2
data-parallel groups only, both ranks of a group receive the same rows, and each group's output is
collected once, from its first rank."""

from __future__ import annotations

import pytest
import torch

from protocol import DataProto
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.workers.helpers import CALL_TIMEOUT_S
from tests.workers.ulysses_probe import LayoutProbe


@pytest.fixture(scope="module")
def probe_group(ray_cluster):
    pool = RayResourcePool(process_on_nodes=[4], use_gpu=False)
    probe = RayClassWithInitArgs(LayoutProbe)
    group = RayWorkerGroup(pool, probe, name_prefix="ulysses_probe", call_timeout_s=CALL_TIMEOUT_S)
    try:
        yield group
    finally:
        group.kill()
        pool.release()


def test_sequence_parallel_ranks_receive_the_same_rows(probe_group):
    layout = probe_group.init_model(2)
    assert [(p["dp_size"], p["sp_rank"]) for p in layout] == [(2, 0), (2, 1), (2, 0), (2, 1)]
    data = DataProto.from_dict({"row": torch.arange(6)})
    echoed = probe_group.echo(data)
    # Every row once, in order, returned by the first rank of its data-parallel group (ranks 0 and 2).
    assert echoed.batch["row"].tolist() == list(range(6))
    assert echoed.batch["rank"].tolist() == [0, 0, 0, 2, 2, 2]
    views = probe_group.group_view(data)
    assert [v["rank"] for v in views] == [0, 2]  # one metrics entry per data-parallel group
    assert [v["rows"] for v in views] == [[0, 1, 2], [3, 4, 5]]
    assert all(v["group_same"] for v in views)


def test_an_uneven_batch_is_padded_per_group_and_unpadded(probe_group):
    probe_group.init_model(2)
    echoed = probe_group.echo(DataProto.from_dict({"row": torch.arange(5)}))
    assert echoed.batch["row"].tolist() == list(range(5))
    assert echoed.batch["rank"].tolist() == [0, 0, 0, 2, 2]


def test_a_size_that_does_not_divide_the_ranks_is_refused(probe_group):
    refused = r"actor.ulysses_sequence_parallel_size=3 must divide the worker group's 4 ranks"
    with pytest.raises(Exception, match=refused):
        probe_group.init_model(3)
