"""actor.router_aux_loss_coef: the routers' load-balancing loss from hooks on a Hugging Face mixture of experts,
captured in training forwards only, masked to real tokens, and trained through (with gradient checkpointing too)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeForCausalLM

from trainer.tiny_model import build_char_tokenizer
from trainer.tiny_moe import ACTIVE_EXPERTS, EXPERTS, build_tiny_moe_config
from workers.config import actor_rollout_ref_config
from workers.moe_router_loss import RouterLogits, has_router, load_balance_loss

TOKENS = 32


def tiny_moe() -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(build_tiny_moe_config(build_char_tokenizer()))


def test_uniform_routing_gives_one_and_collapsed_routing_experts_over_k():
    uniform = torch.zeros(TOKENS, EXPERTS)
    assert float(load_balance_loss([uniform], ACTIVE_EXPERTS, None)) == pytest.approx(1.0)
    collapsed = torch.full((TOKENS, EXPERTS), -30.0)
    collapsed[:, :ACTIVE_EXPERTS] = 30.0
    loss = load_balance_loss([collapsed, uniform], ACTIVE_EXPERTS, None)  # averaged over the two layers
    assert float(loss) == pytest.approx((EXPERTS / ACTIVE_EXPERTS + 1.0) / 2, rel=1e-4)


def test_padding_tokens_are_left_out():
    logits = torch.zeros(TOKENS, EXPERTS)
    logits[TOKENS // 2 :, 0] = 30.0  # the padding half routes everything to expert 0
    mask = torch.zeros(TOKENS)
    mask[: TOKENS // 2] = 1
    masked = float(load_balance_loss([logits], ACTIVE_EXPERTS, mask))
    assert masked == pytest.approx(1.0)
    assert float(load_balance_loss([logits], ACTIVE_EXPERTS, None)) > masked + 0.25


def test_a_training_forward_captures_every_layer_and_trains_the_routers():
    model = tiny_moe()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    router = RouterLogits(model, ACTIVE_EXPERTS)
    ids = torch.randint(3, 90, (2, TOKENS // 2))
    with router.capturing():
        model(input_ids=ids)
    assert len(router.layer_logits) == model.config.num_hidden_layers
    loss = router.balance_loss(torch.ones_like(ids))
    loss.backward()  # the checkpointed layers recompute their routers here: not captured
    assert router.layer_logits == []
    gate_grads = [layer.mlp.gate.weight.grad for layer in model.model.layers]
    assert all(grad is not None and grad.abs().sum() > 0 for grad in gate_grads)
    with torch.no_grad():
        model(input_ids=ids)  # outside capturing(): nothing kept
    assert router.balance_loss(None) is None


def test_a_dense_model_is_refused_by_name():
    dense = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert not has_router(dense) and has_router(tiny_moe())
    with pytest.raises(ValueError, match="declares no mixture-of-experts router.*leave actor.router_aux_loss_coef"):
        RouterLogits(dense, 2)
    with pytest.raises(ValueError, match=r"^strategy router_aux_loss_coef is set, .*leave strategy router_aux_loss_coef"):
        RouterLogits(dense, 2, "strategy router_aux_loss_coef")


def test_router_settings_are_checked_against_the_backend():
    """The load-balancing loss has one key per meaning: the actor's averaged coefficient on either backend, verl's
    per-layer megatron-core keys with strategy=megatron only, never both."""
    megatron = {"model": {"path": "/m"}, "actor": {"strategy": "megatron", "router_aux_loss_coef": 0.01}}
    assert actor_rollout_ref_config(megatron)["actor"]["router_aux_loss_coef"] == 0.01
    verl_key = {"megatron": {"override_transformer_config": {"moe_aux_loss_coeff": 0.01}}}
    with pytest.raises(ValueError, match=r"^actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.01: "
                       r"megatron-core's router settings apply to strategy='megatron' only"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "actor": verl_key})
    with pytest.raises(ValueError, match=r"^actor.router_aux_loss_coef=0.01 and "
                       r"actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.01 both set"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {**megatron["actor"], **verl_key}})
    off = {"megatron": {"override_transformer_config": {"moe_router_load_balancing_type": "none"}}}
    with pytest.raises(ValueError, match="moe_router_load_balancing_type=none turns the load-balancing loss off"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "actor": {**megatron["actor"], **off}})
    wrong = {"strategy": "megatron", "megatron": {"override_transformer_config": {"moe_router_dtype": "bf16"}}}
    with pytest.raises(ValueError, match=r"moe_router_dtype' must be None \(the compute dtype\) or one of "
                       r"\['fp32', 'fp64'\], got 'bf16'"):
        actor_rollout_ref_config({"model": {"path": "/m"}, "actor": wrong})
