"""The FSDP mesh of one process: the models it wraps share one mesh per shard size, so a hybrid-sharded actor,
reference and critic in one worker use one set of communicators; a new default process group gets new meshes. Run on
torch's in-process fake backend, which stands for four ranks without starting them."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from workers.fsdp.wrap import device_mesh

CPU = torch.device("cpu")


def _process_groups() -> int:
    return len(dist.distributed_c10d._world.pg_map)


def _four_fake_ranks() -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)


def test_one_mesh_and_its_groups_per_shard_size_until_the_process_group_ends():
    assert not dist.is_initialized(), "this test starts and ends its own process groups"
    _four_fake_ranks()
    try:
        groups = _process_groups()
        hybrid = device_mesh(CPU, 2)
        assert tuple(hybrid.shape) == (2, 2)
        assert _process_groups() == groups + 2  # the replicate and the shard dimension's groups
        assert device_mesh(CPU, 2) is hybrid  # a second model of the process
        assert _process_groups() == groups + 2
        assert device_mesh(CPU, -1) is device_mesh(CPU, 4)  # every rank: one 1-D mesh either way
        assert device_mesh(CPU, -1).ndim == 1
    finally:
        dist.destroy_process_group()
    _four_fake_ranks()
    try:
        assert device_mesh(CPU, 2) is not hybrid
    finally:
        dist.destroy_process_group()
