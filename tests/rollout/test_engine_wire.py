"""What the trainer hands a vLLM engine of tensor parallel > 1 crosses into its worker processes through vLLM's
msgpack: the sync group's address and the bucket layouts travel as plain lists and come back equal."""

from __future__ import annotations

import os

import msgspec
import pytest
import torch

from workers.rollout.buckets import BucketLayout, plan_buckets
from workers.rollout.sync_group import SyncGroupAddress
from workers.rollout.vllm_options import cpu_thread_binding


def _through_msgpack(value):
    return msgspec.msgpack.decode(msgspec.msgpack.encode(value))


def test_bucket_layouts_survive_msgpack():
    specs = [("a.weight", (4, 3), torch.bfloat16), ("a.bias", (4,), torch.float32), ("b", (2, 2, 2), torch.float16)]
    layouts = plan_buckets(specs, bucket_bytes=32)
    assert len(layouts) > 1
    assert [BucketLayout.from_wire(_through_msgpack(layout.to_wire())) for layout in layouts] == layouts


def test_an_unknown_dtype_name_is_refused():
    with pytest.raises(ValueError, match="'Tensor' is not a torch dtype"):
        BucketLayout.from_wire([8, [["x", [2], "Tensor", 0]]])


def test_sync_group_address_survives_msgpack():
    address = SyncGroupAddress("127.0.0.1", 29511, 3, "nccl")
    assert SyncGroupAddress.from_wire(_through_msgpack(address.to_wire())) == address


def test_cpu_thread_binding_splits_the_allowed_cores_between_the_engine_workers():
    cores = sorted(os.sched_getaffinity(0))
    groups = cpu_thread_binding(len(cores)).split("|")
    assert [int(g) for g in groups] == cores
    with pytest.raises(ValueError, match="needs a core per engine worker"):
        cpu_thread_binding(len(cores) + 1)
