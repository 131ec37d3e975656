"""The Megatron strategy on a real 2-rank Ray group (TP 2 + sequence parallel, megatron-core on CPU over
gloo): one step equals the same step of the HF model (a dense Qwen2, and a Qwen3 mixture of experts with its experts
laid out apart from TP: expert TP 1 x EP 2, its routers trained by megatron-core's load-balancing and z-losses);
checkpoint round trip; verified engine update."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.megatron.moe_models import HFRouterLosses
from tests.strategy.hf_reference import hf_step, moe_and_rows
from tests.strategy.workers import LR, MegatronStrategyProbe

pytest.importorskip("megatron.core", reason="install the [megatron] extra")
pytestmark = pytest.mark.slow

CONFIG = {"backend": "megatron", "optimizer_offload": True,
          "megatron": {"tensor_model_parallel_size": 2, "sequence_parallel": True}}


def test_megatron_strategy_step_checkpoint_and_engine_update(ray_cluster, tmp_path):
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, dtype="float32")
    model = Qwen2ForCausalLM(config)
    folder = str(tmp_path / "model")
    model.save_pretrained(folder)
    ids = torch.randint(1, 100, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded row
    expected = hf_step(model, ids, mask)

    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(MegatronStrategyProbe))
    try:
        group.setup(folder, CONFIG)
        for out in group.step(ids, mask):
            assert out["loss"] == pytest.approx(expected["loss"], rel=1e-5)
            assert out["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
            assert out["lr"] == pytest.approx(LR) and out["sum"] == pytest.approx(3.0)
            for name, tensor in out["weights"].items():
                torch.testing.assert_close(tensor, expected["weights"][name], atol=2e-4, rtol=0)
        for out in group.checkpoint_and_engine(str(tmp_path / "ckpt"), folder, ids, mask):
            assert out["client_state"] == {"k": 1}
            assert out["changed"] > 1e-4 and out["restored_diff"] == 0.0
            assert out["sync"]["rollout/sync_logprob_max_diff"] <= 1e-3
    finally:
        group.kill()
        pool.release()


def test_megatron_strategy_steps_a_mixture_of_experts_with_experts_apart_from_tp(ray_cluster, tmp_path):
    """megatron.expert_model_parallel_size / expert_tensor_parallel_size: attention over TP 2, whole experts over EP 2
    on the same two ranks; router_aux_loss_coef (averaged over the layers: megatron-core's per-layer coefficient over
    the layers) and megatron.moe_z_loss_coeff: the routers' losses join the user's backward. One step equals the HF
    model's with those losses added; `router_losses` reports the HF model's values."""
    folder = str(tmp_path / "moe")
    model, ids, mask = moe_and_rows(folder)
    router_losses = HFRouterLosses(model, {"aux_loss_coeff": 0.4, "averaged_over_layers": True, "z_loss_coeff": 0.02},
                                   sequence_shards=2)
    expected = hf_step(model, ids, mask, router_losses)
    folded = {"backend": "megatron", "router_aux_loss_coef": 0.4,
              "megatron": {"tensor_model_parallel_size": 2, "sequence_parallel": True, "expert_model_parallel_size": 2,
                           "expert_tensor_parallel_size": 1, "moe_z_loss_coeff": 0.02}}
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(MegatronStrategyProbe))
    try:
        group.setup(folder, folded)
        for out in group.step(ids, mask, router_losses=True):
            assert out["loss"] == pytest.approx(expected["loss"], rel=1e-5)
            assert out["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
            assert out["router"] == pytest.approx({"router_aux_loss": router_losses.aux[0],
                                                   "router_z_loss": router_losses.z[0]}, rel=1e-5)
            assert out["weights"].keys() == expected["weights"].keys()
            for name, tensor in out["weights"].items():
                torch.testing.assert_close(tensor, expected["weights"][name], atol=2e-4, rtol=0, msg=name)
    finally:
        group.kill()
        pool.release()
