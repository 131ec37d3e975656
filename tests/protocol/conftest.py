"""Fixtures for protocol tests: sample DataProtos (Ray comes from tests/conftest.py's ray_cluster)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from protocol.arrays import to_object_array
from protocol.data_proto import DataProto

# ray_cluster: the shared session fixture in tests/conftest.py (one local Ray cluster per run).


def make_sample(n: int = 6) -> DataProto:
    """n samples with every kind of field: several dtypes, a nested TensorDict, object arrays."""
    nested = TensorDict({"logp": torch.randn(n, 3), "mask": torch.rand(n, 3) > 0.5}, batch_size=[n])
    batch = TensorDict(
        {
            "input_ids": torch.arange(n * 4, dtype=torch.int64).view(n, 4),
            "values": torch.randn(n, 4),
            "bf": torch.randn(n, 2).to(torch.bfloat16),
            "done": torch.arange(n) % 2 == 0,
            "extra": nested,
        },
        batch_size=[n],
    )
    non_tensor = {
        "uid": to_object_array([f"uid-{i}" for i in range(n)]),
        "info": to_object_array([{"i": i, "tags": [i, i + 1]} for i in range(n)]),
        "score": np.arange(n, dtype=np.float64) / 2,
    }
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info={"temperature": 1.0, "step": 3})


@pytest.fixture
def sample() -> DataProto:
    torch.manual_seed(0)
    return make_sample()


@pytest.fixture
def sample_factory():
    """make_sample(n) for tests that need several lengths."""
    torch.manual_seed(0)
    return make_sample
