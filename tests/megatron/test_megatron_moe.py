"""`MegatronBackend` on a Qwen3 mixture of experts against the HF model it was loaded from (fp32, megatron-core's
MoE layer with SequentialMLP experts and the all-to-all dispatcher on CPU over gloo, real Ray workers): response
log-probs and entropies, one training step's gradient norm and the weights after one Adam step (streamed back out
under the per-expert HF names, gathered over the EP group) agree at EP=1, EP=2, TP=2, PP=2 x EP=2, and TP=2 with whole
experts (expert TP 1) at EP=2 and EP=1, with normalised and unnormalised top-k routing weights; the weights streamed
out right after loading are the checkpoint's, exactly. With the routers' losses on (megatron-core's load-balancing
loss and z-loss, at PP=2 x EP=2 and TP=2 x EP=2) the step equals the HF model's with the FSDP workers' loss added, and
the reported losses equal the HF model's."""

import glob

import pytest
import torch
from safetensors.torch import load_file

from tests.megatron.moe_models import HFRouterLosses, per_expert_state, qwen3_moe
from tests.megatron.test_megatron_backend import LR, _batch, _hf_reference
from trainer.memory_plan.residency import role_memory
from trainer.memory_plan.setup import ModelRole
from trainer.memory_plan.shape import ModelShape
from trainer.memory_plan.terms import Trainability

pytest.importorskip("megatron.core", reason="install the [megatron] extra")


# Router losses (workers/megatron/router_training.py): actor.router_aux_loss_coef's (averaged over the layers) with a
# z-loss, and megatron-core's own per-layer coefficient (verl's moe_aux_loss_coeff) under sequence parallelism (at PP 2
# the second stage's routers get this TP rank's part of the padding mask from the backend, not from megatron-core).
AVERAGED_WITH_Z = {"aux_loss_coeff": 0.5, "averaged_over_layers": True, "z_loss_coeff": 0.02}
PER_LAYER = {"aux_loss_coeff": 0.2}


@pytest.mark.parametrize(
    "tp, pp, ep, dp, norm_topk_prob, tied, etp, router",
    # EP=2 alone and PP=2 alone are inside pp2-ep2 and ep2-unnormalised-topk: not run again (CI time).
    # tp2-etp1-ep2: verl's "parallel folding", attention over TP 2 and whole experts over EP 2 on the same two ranks;
    # tp2-etp1: whole experts on both TP ranks, their gradients summed over the expert-data-parallel pair.
    [(1, 1, 1, 1, True, True, None, None), (1, 1, 2, 2, False, False, None, None), (2, 1, 1, 1, True, False, None, None),
     (1, 2, 2, 2, True, True, None, AVERAGED_WITH_Z), (2, 1, 2, 2, True, False, None, PER_LAYER),
     (2, 1, 2, 1, True, False, 1, None), (2, 1, 1, 1, True, True, 1, None), (2, 2, 1, 1, True, False, None, PER_LAYER)],
    ids=["ep1", "ep2-unnormalised-topk", "tp2", "pp2-ep2-router-losses", "tp2-ep2-router-loss", "tp2-etp1-ep2",
         "tp2-etp1", "tp2-pp2-router-loss"],
)
def test_moe_engine_matches_the_hf_model(megatron_probes, tmp_path, tp, pp, ep, dp, norm_topk_prob, tied, etp, router):
    model = qwen3_moe(tmp_path, norm_topk_prob=norm_topk_prob, tied=tied)
    initial = per_expert_state(model)
    # The loader reads the checkpoint's per-expert names; the helper's split of the fused experts must match them.
    (on_disk,) = [load_file(f) for f in glob.glob(str(tmp_path / "*.safetensors"))]
    assert sorted(on_disk) == sorted(k for k in initial if not (tied and k == "lm_head.weight"))
    assert all(torch.equal(on_disk[k], initial[k]) for k in on_disk)
    router_losses = HFRouterLosses(model, router) if router else None
    hf = _hf_reference(model, _batch(), router_losses)
    with megatron_probes(tp * pp * dp) as group:
        outputs = group.run(str(tmp_path), tp, pp, tp > 1, False, _batch(), LR, ep, etp, router)
    (result,) = [o for o in outputs if o is not None]
    if router_losses is None:
        assert all("router_aux_loss" not in metrics for metrics in result["metrics"])
    else:
        # Reported as the FSDP workers do: per micro-batch, averaged over the layers (of both pipeline stages).
        for metrics in result["metrics"]:
            assert metrics["router_aux_loss"] == pytest.approx(sum(router_losses.aux) / 2, rel=1e-5)
            assert ("router_z_loss" in metrics) == ("z_loss_coeff" in router)
            if "z_loss_coeff" in router:
                assert metrics["router_z_loss"] == pytest.approx(sum(router_losses.z) / 2, rel=1e-5)
    # The memory plan's per-GPU weights (trainer/memory_plan/residency.py) are this rank's parameters exactly: the
    # last stage's slice, experts split over TP x EP, the padded vocabulary, norms and routers whole on each TP rank.
    shape = ModelShape.from_config(model.config.to_dict())
    role = ModelRole("actor", shape, "lm", 4, "megatron", Trainability(full=True), tp=tp, pp=pp, ep=ep, etp=etp)
    assert role_memory(role, tp * pp * dp).weights // 4 == result["local_params"]
    # HF -> Megatron (split over TP / PP / EP) -> HF gives back the checkpoint's tensors exactly.
    assert result["loaded_weights"].keys() == on_disk.keys()
    for key, tensor in on_disk.items():
        assert torch.equal(result["loaded_weights"][key], tensor), key
    valid = _batch()["response_mask"].bool()
    torch.testing.assert_close(result["log_probs"][valid], hf["log_probs"][valid], atol=2e-6, rtol=0)
    torch.testing.assert_close(result["entropy"][valid], hf["entropy"][valid], atol=2e-6, rtol=0)
    assert result["grad_norm"] == pytest.approx(hf["grad_norm"], rel=1e-5)
    expected = per_expert_state(model)  # after the reference's Adam step
    if tied:
        expected.pop("lm_head.weight")
    assert result["weights"].keys() == expected.keys()
    moved = 0
    for key, tensor in expected.items():
        # Adam's first step moves every weight by ~lr; the two implementations agree far closer than that.
        torch.testing.assert_close(result["weights"][key], tensor, atol=2e-4, rtol=0, msg=key)
        moved += not torch.equal(result["weights"][key], initial[key])
    # Every expert a token was routed to was trained, on whichever EP rank holds it.
    assert moved > len(expected) // 2
    for e in range(4):
        assert not torch.equal(result["weights"][f"model.layers.0.mlp.experts.{e}.down_proj.weight"],
                               initial[f"model.layers.0.mlp.experts.{e}.down_proj.weight"]), e
