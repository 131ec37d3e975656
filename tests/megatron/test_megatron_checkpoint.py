"""A Megatron checkpoint with the distributed optimizer read back (megatron-core on CPU over gloo, real Ray workers):
each rank's float32 main weights and Adam state (torch's Adam, with its per-parameter step) come back, so a step
taken after the load equals the step the saving run took next, bit for bit, in float32 and in bf16."""

import pytest
import torch

from tests.megatron.test_megatron_offload import _batch, _model_folder

pytest.importorskip("megatron.core", reason="install the [megatron] extra")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_resumed_distributed_optimizer_takes_the_same_next_step(megatron_probes, tmp_path, dtype):
    folder = _model_folder(tmp_path / "model")
    with megatron_probes(2) as group:
        outputs = group.resume_round_trip(folder, 2, True, _batch(), str(tmp_path / "checkpoint"), dtype)
    (result,) = [o for o in outputs if o is not None]
    straight, resumed = result["weights"]
    assert result["grad_norms"][0] == result["grad_norms"][1]
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert sorted(p.name for p in (tmp_path / "checkpoint").glob("optimizer_shard_rank*.pt")) == [
        "optimizer_shard_rank0.pt", "optimizer_shard_rank1.pt",
    ]
