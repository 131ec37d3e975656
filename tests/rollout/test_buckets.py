"""Bucketing and the bucketed transports, without an engine: sizes respected, every tensor exactly once,
bytes intact through pack/unpack and through a real gloo broadcast between threads."""

import threading

import pytest
import torch
from torch import nn

from workers.rollout.buckets import ALIGN_BYTES, bucket_views, pack_bucket, plan_buckets
from workers.rollout.sync_group import WeightSyncGroup
from workers.rollout.weight_sync import (
    broadcast_buckets,
    named_full_parameters,
    plan_model_buckets,
    receive_broadcast_buckets,
)


def _specs():
    shapes = [(7, 5), (130,), (64, 64), (3,), (300, 10), (1,), (33, 17)]
    return [(f"p{i}", s, torch.float32) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("bucket_bytes", [64, 1000, 4096, 1 << 20])
def test_buckets_respect_the_size_and_hold_every_tensor_once(bucket_bytes):
    specs = _specs()
    layouts = plan_buckets(specs, bucket_bytes)
    names = [n for layout in layouts for n in layout.names]
    assert names == [name for name, _, _ in specs]  # all, once, in order
    for layout in layouts:
        assert layout.nbytes <= bucket_bytes or len(layout.slots) == 1  # only a lone oversized tensor may exceed
        assert all(slot.offset % ALIGN_BYTES == 0 for slot in layout.slots)
        ends = [slot.offset + slot.nbytes for slot in layout.slots]
        assert all(end <= nxt for end, nxt in zip(ends, [s.offset for s in layout.slots[1:]]))  # no overlap
    if bucket_bytes == 1 << 20:
        assert len(layouts) == 1
    if bucket_bytes == 64:
        assert len(layouts) == len(specs)


def test_duplicate_names_and_bad_sizes_are_rejected():
    with pytest.raises(ValueError, match="listed twice"):
        plan_buckets([("a", (2,), torch.float32), ("a", (2,), torch.float32)])
    with pytest.raises(ValueError, match="bucket_bytes must be >= 1"):
        plan_buckets(_specs(), 0)


def test_pack_then_views_round_trip_with_a_dtype_cast():
    tensors = [torch.randn(s) for _, s, _ in _specs()]
    layouts = plan_buckets([(n, s, torch.bfloat16) for n, s, _ in _specs()], 2048)
    seen = {}
    index = 0
    for layout in layouts:
        chunk = tensors[index : index + len(layout.slots)]
        index += len(layout.slots)
        buffer = pack_bucket(layout, chunk, "cpu")
        assert buffer.dtype == torch.uint8 and buffer.numel() == layout.nbytes
        for (name, view), original in zip(bucket_views(buffer, layout), chunk):
            assert view.dtype == torch.bfloat16
            torch.testing.assert_close(view, original.to(torch.bfloat16))
            seen[name] = view
    assert list(seen) == [n for n, _, _ in _specs()]
    with pytest.raises(ValueError, match="has shape"):
        pack_bucket(layouts[0], [torch.zeros(2, 2)] * len(layouts[0].slots), "cpu")


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.head = nn.Linear(16, 50, bias=False)


def test_named_full_parameters_follow_the_plan_and_cast():
    model = _Tiny()
    layouts = plan_model_buckets(model, torch.float16, bucket_bytes=1500)
    assert len(layouts) > 1
    pairs = list(named_full_parameters(model, layouts))
    assert [n for n, _ in pairs] == [n for n, _ in model.named_parameters()]
    for (name, tensor), (_, param) in zip(pairs, model.named_parameters()):
        assert tensor.dtype == torch.float16 and tensor.shape == param.shape
        torch.testing.assert_close(tensor, param.detach().half())


def test_broadcast_buckets_reach_every_receiver_intact():
    sender_model = _Tiny()
    layouts = plan_model_buckets(sender_model, torch.float32, bucket_bytes=2048)
    host = WeightSyncGroup()
    address = host.host_store(world_size=3, backend="gloo")
    received: dict[int, dict[str, torch.Tensor]] = {}
    errors = []

    def receiver(rank):
        try:
            group = WeightSyncGroup()
            group.connect(address, rank)
            received[rank] = {n: t.clone() for n, t in receive_broadcast_buckets(layouts, group, torch.device("cpu"))}
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=receiver, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    host.connect(address, 0)
    sent = broadcast_buckets(sender_model, layouts, host, torch.device("cpu"))
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sent == sum(layout.nbytes for layout in layouts)
    expected = dict(sender_model.named_parameters())
    for rank in (1, 2):
        assert list(received[rank]) == list(expected)
        for name, tensor in received[rank].items():
            assert torch.equal(tensor, expected[name].detach())


def test_sync_group_rejects_bad_backend_and_rank():
    with pytest.raises(ValueError, match="backend must be one of"):
        WeightSyncGroup().host_store(2, "mpi")
    host = WeightSyncGroup()
    address = host.host_store(2, "gloo")
    with pytest.raises(ValueError, match="outside the weight-sync group"):
        WeightSyncGroup().connect(address, 5)


def test_a_stream_is_cut_into_its_planned_buckets_and_a_stream_out_of_plan_is_named():
    from workers.rollout.weight_sync import stream_buckets

    specs = [("a", (4,), torch.float32), ("b", (300,), torch.float32), ("c", (2, 3), torch.float32)]
    layouts = plan_buckets(specs, 1 << 10)
    tensors = {name: torch.full(shape, float(i)) for i, (name, shape, _) in enumerate(specs)}
    buckets = list(stream_buckets(iter(tensors.items()), layouts))
    assert [layout for layout, _ in buckets] == layouts and len(layouts) > 1
    streamed = [t for _, bucket in buckets for t in bucket]
    assert all(torch.equal(a, b) for a, b in zip(streamed, tensors.values())) and len(streamed) == 3
    swapped = iter([("b", tensors["b"]), ("a", tensors["a"]), ("c", tensors["c"])])
    with pytest.raises(RuntimeError, match="the stream gave 'b' where the bucket plan has 'a'"):
        list(stream_buckets(swapped, layouts))
    extra = iter([*tensors.items(), ("d", torch.zeros(1))])
    with pytest.raises(RuntimeError, match="the stream gave 'd' after every planned bucket was filled"):
        list(stream_buckets(extra, layouts))
