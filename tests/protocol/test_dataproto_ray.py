"""Transport through a real local Ray cluster (shared per session via the ray_cluster fixture)."""

import warnings

import numpy as np
import pytest
import torch

from protocol.data_proto import DataProto
from protocol.testing import assert_dataproto_equal
from protocol.transport import borrow_received_buffers

ROWS = 2048  # big enough (> Ray's 100 KiB inline limit) to live in the shared-memory store


def make_data() -> DataProto:
    generator = torch.Generator().manual_seed(0)
    return DataProto.from_dict(
        {
            "f32": torch.randn(ROWS, 64, generator=generator),
            "bf16": torch.randn(ROWS, 64, generator=generator).to(torch.bfloat16),
            "i64": torch.arange(ROWS * 4).view(ROWS, 4),
            "mask": torch.arange(ROWS) % 3 == 0,
        },
        {"uid": [f"u{i}" for i in range(ROWS)], "score": np.arange(ROWS, dtype=np.float32)},
        {"step": 1},
    )


@pytest.fixture(scope="module")
def echo_actor(ray_cluster):
    @ray_cluster.remote(num_cpus=0)
    class Echo:
        def mutate_and_describe(self, data: DataProto) -> dict:
            writable = {}
            for key in ("f32", "bf16", "i64", "mask"):
                tensor = data.batch[key]
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    tensor.add_(1) if key != "mask" else tensor.logical_not_()
                writable[key] = str(tensor.dtype)
            return writable

        def echo(self, data: DataProto) -> DataProto:
            return data[: len(data) // 2]

    actor = Echo.remote()
    yield actor
    ray_cluster.kill(actor)


def test_put_get_round_trip_gives_private_writable_copies(ray_cluster):
    data = make_data()
    ref = ray_cluster.put(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning on the default path
        received = ray_cluster.get(ref)
    assert_dataproto_equal(received, data)
    for key in ("f32", "bf16", "i64"):
        received.batch[key].add_(1)
    received.batch["mask"].logical_not_()
    assert_dataproto_equal(ray_cluster.get(ref), data)  # the stored object is untouched


def test_actor_round_trip_keeps_values_and_store_intact(ray_cluster, echo_actor):
    data = make_data()
    ref = ray_cluster.put(data)
    dtypes = ray_cluster.get(echo_actor.mutate_and_describe.remote(ref))
    assert dtypes == {"f32": "torch.float32", "bf16": "torch.bfloat16", "i64": "torch.int64", "mask": "torch.bool"}
    assert_dataproto_equal(ray_cluster.get(ref), data)  # the actor's writes stayed private
    half = ray_cluster.get(echo_actor.echo.remote(data))
    assert_dataproto_equal(half, data[: ROWS // 2])


def test_borrowed_gets_share_store_memory(ray_cluster):
    data = make_data()
    ref = ray_cluster.put(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with borrow_received_buffers():
            first = ray_cluster.get(ref)
            second = ray_cluster.get(ref)
    assert first.batch["f32"].data_ptr() == second.batch["f32"].data_ptr()
    assert first.batch["bf16"].dtype == torch.bfloat16
    assert_dataproto_equal(first, data)
    copied = ray_cluster.get(ref)
    assert copied.batch["f32"].data_ptr() != first.batch["f32"].data_ptr()
    assert not first.non_tensor_batch["score"].flags.writeable  # store memory is read-only
    merged = DataProto.concat([first, second])  # the intended use: copy right away
    assert len(merged) == 2 * ROWS
