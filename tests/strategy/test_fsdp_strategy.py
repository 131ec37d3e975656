"""The FSDP strategy on a real 2-rank Ray worker group (gloo): one group shared by every method test; a mixture of
experts with its routers' load-balancing loss in a group of its own."""

import pytest
import torch

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.megatron.moe_models import HFRouterLosses
from tests.strategy.hf_reference import hf_step, moe_and_rows
from tests.strategy.workers import MegatronStrategyProbe, StrategyProbe
from workers.rollout.verify import MOE_HALF_PRECISION_TOLERANCE, MOE_ROUTING_OUTLIERS

# logits_chunk_tokens 5: sequence_log_probs (11 positions a row) scores the LM head in several chunks.
CONFIG = {"backend": "fsdp2", "grad_clip": 1.0, "optimizer_offload": True, "logits_chunk_tokens": 5}


@pytest.fixture(scope="module")
def probe(ray_cluster, tiny_assets):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(StrategyProbe))
    group.setup(tiny_assets["model"], CONFIG)
    yield group
    group.kill()
    pool.release()


def test_all_reduce_and_all_gather_values(probe):
    rank0, rank1 = probe.collectives()
    for out in (rank0, rank1):
        assert out["mean"] == pytest.approx(1.5)
        assert out["sum"] == pytest.approx(3.0)
        assert out["max"].tolist() == [1.0, 0.0]
        assert out["dict"]["a"] == pytest.approx(1.0) and out["dict"]["b"].item() == pytest.approx(1.5)
        assert out["gather_tensor"].tolist() == [[0.0] * 3] * 2 + [[1.0] * 3] * 2
        assert out["gather_scalar_tensor"].tolist() == [0, 10]
        assert out["gather_dict"] == {"rank": [0, 1], "name": ["w0", "w1"]}  # a dict: per key
        assert out["gather_list"] == [[0], [1, 1]]


def test_optimizer_step_equals_hand_written_fsdp_and_offload_round_trip_is_bit_exact(probe):
    for out in probe.step_against_manual_fsdp():
        for ours, manual in out["norms"]:
            assert ours == pytest.approx(manual, rel=1e-6)
        assert out["max_param_diff"] <= 1e-6
        assert out["params_moved"]
        assert out["bit_exact"] and out["state_released"] and out["same_state_objects"]
        assert "offloaded; call maybe_load_optimizer" in out["stepped_while_offloaded"]
        assert out["grad_norm_recorded"] == out["norms"][-1][0]


def test_sequence_log_probs_in_chunks_equal_the_full_logits(probe):
    for out in probe.chunked_against_full_logits():
        assert out["chunk"] == 5 and out["chunked_head"] and out["same_params"] and out["largest_grad"] > 1e-3
        assert out["values"] <= 1e-5 and out["grads"] <= 1e-5


def test_checkpoint_round_trip_in_the_atomic_format(probe, tmp_path):
    from workers.checkpoint_format import checkpoint_problem

    outs = probe.checkpoint_round_trip(str(tmp_path / "ckpt"))
    for out in outs:
        assert out["folder"] == str((tmp_path / "ckpt" / "global_step_3").resolve())
        assert out["client_state"] == {"step": 3}
        assert out["changed"] > 1e-4 and out["restored_diff"] == 0.0
    assert checkpoint_problem(outs[0]["folder"]) is None
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"


@pytest.mark.slow
def test_vllm_engine_gathers_generates_in_order_and_receives_verified_weights(probe, tiny_assets):
    inference = {"model_path": tiny_assets["model"], "group_size": 1, "cpu_kv_cache_mb": 64}
    outs = probe.engine_round_trip("vllm", inference)
    assert [o["owns_engine"] for o in outs] == [True, True]
    for out in outs:
        # Every result is scored by the model like the engine scored it: right prompt, right order.
        assert out["before"] <= 1e-3 and out["after"] <= 1e-3
        assert out["sync"]["rollout/sync_logprob_max_diff"] <= 1e-3
        assert out["sync"]["rollout/sync_tensors"] > 0
        assert out["repeat_sync"]["rollout/sync_logprob_max_diff"] <= 1e-3
    for message in probe.update_with_lost_tensor():
        assert message.startswith(
            "WeightSyncMismatch: update_engine_weights: after the weight sync the rollout engine's log-probs"
        ), message
        assert message.endswith("the inference config's verify_tolerance sets the bound"), message


def test_hf_engine_shared_by_two_ranks_gathers_and_scatters_in_order(probe, tiny_assets):
    outs = probe.engine_round_trip("hf", {"model_path": tiny_assets["model"], "group_size": 2})
    assert [o["owns_engine"] for o in outs] == [True, False]  # one engine, on rank 0, serves both ranks
    for out in outs:
        assert out["before"] <= 1e-3 and out["after"] <= 1e-3
        assert out["sync"]["rollout/sync_logprob_max_diff"] <= 1e-3


def test_a_mixture_of_experts_trains_its_routers_with_the_load_balancing_loss(ray_cluster, tmp_path):
    """router_aux_loss_coef: each training forward of sequence_log_probs carries the routers' loss (averaged over the
    layers, padding left out) into the user's backward; one step equals the HF model's with that loss added, and
    router_losses reports the HF model's value. Both ranks see the same rows (the gradients FSDP averages are equal)."""
    folder = str(tmp_path / "moe")
    model, ids, mask = moe_and_rows(folder)
    router_losses = HFRouterLosses(model, {"aux_loss_coeff": 0.3, "averaged_over_layers": True})
    expected = hf_step(model, ids, mask, router_losses, per_expert=False)
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(MegatronStrategyProbe))
    try:
        group.setup(folder, {"backend": "fsdp2", "router_aux_loss_coef": 0.3})
        for out in group.step(ids, mask, router_losses=True):
            assert out["loss"] == pytest.approx(expected["loss"], rel=1e-5)
            assert out["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
            assert out["router"] == pytest.approx({"router_aux_loss": router_losses.aux[0]}, rel=1e-5)
            for name, tensor in out["weights"].items():
                torch.testing.assert_close(tensor, expected["weights"][name], atol=2e-4, rtol=0, msg=name)
        # The engine's sync check allows a mixture of experts' routing near-ties in half precision, as the
        # trainer's hybrid rollout does (a dense model's bound failed a correct sync on a GPU).
        for out in group.engine_sync_bound(folder):
            assert out["outliers"] == MOE_ROUTING_OUTLIERS and out["tolerance"] == MOE_HALF_PRECISION_TOLERANCE
            assert out["sync"]["rollout/sync_tensors"] > 0
    finally:
        group.kill()
        pool.release()
