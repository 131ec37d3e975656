"""megatron-core's process groups inside a worker group (gloo on CPU): its TP/PP/DP ranks agree with the
group's mesh, data is split over DP only and collected from TP rank 0 of the last PP stage."""

import pytest
import torch

from protocol import DataProto
from workers.megatron.parallel import megatron_mesh_shape

pytest.importorskip("megatron.core", reason="install the [megatron] extra")


@pytest.mark.parametrize("tp, pp", [(2, 2), (2, 1), (1, 2)])
def test_megatron_groups_match_the_mesh_dispatch(megatron_probes, tp, pp):
    with megatron_probes(4) as group:
        info = group.init_parallel(tp, pp)
        out = group.compute(DataProto.from_dict({"x": torch.arange(12, dtype=torch.float32)}))
    dp = 4 // (tp * pp)
    for rank, r in enumerate(info):
        assert (r["pp_rank"], r["dp_rank"], r["tp_rank"]) == (rank // (dp * tp), (rank // tp) % dp, rank % tp)
        assert r["tp_group"] == [rank - rank % tp + i for i in range(tp)]
        assert r["collector"] == (r["tp_rank"] == 0 and r["pp_rank"] == pp - 1)
    assert torch.equal(out.batch["x"], torch.arange(12, dtype=torch.float32))  # every row back once, in order
    assert bool(out.batch["tp_consistent"].all())
    collectors = [r["rank"] for r in info if r["collector"]]
    chunk = 12 // dp
    assert out.batch["seen_by"].tolist() == [collectors[i // chunk] for i in range(12)]


def test_world_sizes_that_cannot_hold_the_split_are_named():
    assert megatron_mesh_shape(8, 2, 2) == {"pp": 2, "dp": 2, "tp": 2}
    with pytest.raises(ValueError, match=r"6 workers cannot hold tensor parallel 2 x pipeline parallel 2"):
        megatron_mesh_shape(6, 2, 2)
    assert megatron_mesh_shape(8, 2, 1, ep=4) == {"pp": 1, "dp": 4, "tp": 2}  # EP splits the DP ranks' experts
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=4 must divide the data-parallel size 2 .* valid EP sizes: \[1, 2\]"):
        megatron_mesh_shape(8, 2, 2, ep=4)
    # Parallel folding: the experts lay a stage's TP x DP ranks out again, so EP may exceed DP (verl: TP 4, expert TP 1).
    assert megatron_mesh_shape(2, 2, 1, ep=2, etp=1) == {"pp": 1, "dp": 1, "tp": 2}
    assert megatron_mesh_shape(16, 4, 2, ep=8, etp=1) == {"pp": 2, "dp": 2, "tp": 4}
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=4 must divide 2 \(= tp 2 x dp 1 / "
                                         r"expert_tensor_parallel_size 1\); valid EP sizes: \[1, 2\]"):
        megatron_mesh_shape(2, 2, 1, ep=4, etp=1)
    with pytest.raises(ValueError, match=r"expert_tensor_parallel_size=3 must divide the 4 ranks of a pipeline stage "
                                         r"\(tp=4 x dp=1\); valid sizes: \[1, 2, 4\]"):
        megatron_mesh_shape(4, 4, 1, etp=3)
