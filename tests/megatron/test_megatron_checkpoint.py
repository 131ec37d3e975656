"""A Megatron checkpoint with the distributed optimizer read back (megatron-core on CPU over gloo, real Ray workers):
each rank's float32 main weights and Adam state (torch's Adam, with its per-parameter step) come back, so a step
taken after the load equals the step the saving run took next, bit for bit, in float32 and in bf16."""

import pytest
import torch

from tests.megatron.moe_models import qwen3_moe
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
    assert sorted(p.name for p in (tmp_path / "checkpoint").glob("optimizer_*.pt")) == [
        "optimizer_tp0_pp0_rank0.pt", "optimizer_tp0_pp0_rank1.pt",
    ]


def _model_space_state(folder) -> dict[str, dict[str, torch.Tensor]]:
    """Every parameter's optimizer state (main weight, Adam moments) whole, joined from the slices of every file; a
    tensor-parallel slice is keyed by its TP rank (an expert's by its expert-TP rank)."""
    slices: dict[str, list[dict]] = {}
    for file in sorted(folder.glob("optimizer_*.pt")):
        state = torch.load(file, weights_only=True)
        for key, piece in state["pieces"].items():
            split = f"etp{state['expert_tp_rank']}" if ".experts." in key else f"tp{state['tp_rank']}"
            slices.setdefault(f"{split}/{key}", []).append(piece)
    whole = {}
    for key, pieces in slices.items():
        pieces.sort(key=lambda piece: piece["start"])
        assert [p["start"] for p in pieces[1:]] == [p["end"] for p in pieces[:-1]], key  # no gap, no overlap
        assert pieces[0]["start"] == 0 and pieces[-1]["end"] == pieces[0]["numel"], key
        whole[key] = {name: torch.cat([p[name] for p in pieces]) for name in ("param", "exp_avg", "exp_avg_sq")}
    return whole


def _close_after_a_step(expected: dict, got: dict) -> None:
    """The step after a load at another DP size: the same mean gradient, its norm summed in another order."""
    assert abs(got["grad_norm"] - expected["grad_norm"]) <= 1e-5 * expected["grad_norm"]
    for name, weight in expected["weights"].items():
        assert torch.allclose(got["weights"][name], weight, rtol=0, atol=1e-2 * weight.abs().max().item()), name
        assert (got["weights"][name] != weight).float().mean() < 0.01, name  # a few bf16 roundings at most


def test_the_distributed_optimizer_state_is_read_back_on_fewer_and_more_ranks(megatron_probes, tmp_path):
    """`trainer.on_node_loss=continue` reloads on the ranks that are left: saved over DP2, read by DP1 (its own
    checkpoint then holds the very same state), read back by DP2; the step after each load is the straight run's."""
    folder, batch = _model_folder(tmp_path / "model", num_hidden_layers=3), _batch()
    dp2, dp1, dp2_again = tmp_path / "dp2", tmp_path / "dp1", tmp_path / "dp2_again"
    with megatron_probes(2) as group:
        (straight,) = [o for o in group.reshard_leg(folder, batch, "bfloat16", None, str(dp2)) if o is not None]
    with megatron_probes(1) as group:
        (shrunk,) = group.reshard_leg(folder, batch, "bfloat16", str(dp2), str(dp1))
    with megatron_probes(2) as group:
        (grown,) = [o for o in group.reshard_leg(folder, batch, "bfloat16", str(dp1), str(dp2_again)) if o is not None]
    files = dp2.glob("optimizer_*.pt")
    pieces = [piece for file in files for piece in torch.load(file, weights_only=True)["pieces"].values()]
    split = [piece for piece in pieces if piece["end"] - piece["start"] < piece["numel"]]
    assert split, "no parameter is split between the two ranks: the test would not read one from two files"
    saved, reread, reread_again = _model_space_state(dp2), _model_space_state(dp1), _model_space_state(dp2_again)
    assert saved.keys() == reread.keys() == reread_again.keys() and saved
    for key in saved:
        for name in saved[key]:
            assert torch.equal(reread[key][name], saved[key][name]), (key, name)
            assert torch.equal(reread_again[key][name], saved[key][name]), (key, name)
    assert len(list(dp1.glob("optimizer_*.pt"))) == 1 and len(list(dp2_again.glob("optimizer_*.pt"))) == 2
    _close_after_a_step(straight, shrunk)
    _close_after_a_step(straight, grown)


def test_folded_experts_optimizer_state_is_read_back_across_tensor_parallel_ranks(megatron_probes, tmp_path):
    """verl's "parallel folding" (expert TP 1 under TP 2): each expert is whole on both TP ranks, and the distributed
    optimizer shards its state over the expert-data-parallel ranks, which span both TP coordinates. Saved by TP 2 x
    DP 2 and read by TP 2 x DP 1, a rank takes expert slices from the files of the other TP coordinate (and dense
    slices only from its own); the state comes back whole and the next step is the straight run's."""
    folder, batch = str(tmp_path / "model"), _batch()
    qwen3_moe(folder, layers=1, experts=6)  # 6 experts over 4 expert-data-parallel ranks: boundaries cut experts
    dp2, dp1 = tmp_path / "dp2", tmp_path / "dp1"
    with megatron_probes(4) as group:
        (straight,) = [o for o in group.reshard_leg(folder, batch, "float32", None, str(dp2), 2, 1) if o is not None]
    with megatron_probes(2) as group:
        (shrunk,) = [o for o in group.reshard_leg(folder, batch, "float32", str(dp2), str(dp1), 2, 1) if o is not None]
    assert sorted(p.name for p in dp2.glob("model_optim_*.pt")) == ["model_optim_tp0_pp0_etp0.pt",
                                                                    "model_optim_tp1_pp0_etp0.pt"]
    experts_by_tp: dict[int, set[str]] = {0: set(), 1: set()}
    for file in dp2.glob("optimizer_*.pt"):
        state = torch.load(file, weights_only=True)
        experts_by_tp[state["tp_rank"]].update(key for key in state["pieces"] if ".experts." in key)
    # Each TP coordinate's files hold part of the experts' state: a rank of TP 2 x DP 1 needs both to cover its range.
    assert experts_by_tp[0] and experts_by_tp[1] and experts_by_tp[0] & experts_by_tp[1]
    saved, reread = _model_space_state(dp2), _model_space_state(dp1)
    assert saved.keys() == reread.keys() and any(".experts." in key for key in saved)
    for key in saved:
        for name in saved[key]:
            assert torch.equal(reread[key][name], saved[key][name]), (key, name)
    _close_after_a_step(straight, shrunk)
