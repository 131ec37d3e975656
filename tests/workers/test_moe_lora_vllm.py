"""LoRA on a mixture of experts' fused experts, handed to vLLM as the trainer holds it.

What vLLM does with the adapter the sync sends (trainer names -> PEFT names -> `LoRAModel.from_lora_tensors`,
then its own per-expert split of the fused factors when it packs the adapter) must give every expert the
weight change PEFT's adapter gives it; the engine's rank slot must hold the gate_up factors' 2r, and the memory
plan must count vLLM's per-expert buffers at that slot. vLLM's Triton MoE-LoRA kernels need a GPU: the GPU
suite's `moe_lora_vllm_hybrid` case runs the adapter through them.
"""

from __future__ import annotations

import types

import torch
from transformers import AutoModelForCausalLM

from trainer.memory_plan.shape import ModelShape, engine_lora_params, lora_targets, read_model_config
from trainer.tiny_model import build_char_tokenizer, build_tiny_model
from trainer.tiny_moe import build_tiny_moe, build_tiny_moe_config
from workers.lora.model import add_lora_adapters
from workers.lora.moe_vllm import adapts_fused_experts, has_fused_expert_factors, module_kind
from workers.lora.spec import ADAPTER_NAME, LoraSpec, peft_tensor_name, vllm_rank_slot
from workers.lora.vllm_adapter import engine_options

ALL_LINEAR = LoraSpec.from_model_config({"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"})
ATTENTION_AND_ROUTER = LoraSpec.from_model_config(
    {"lora_rank": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate"]}
)


def _adapted_tiny_moe() -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_tiny_moe_config(build_char_tokenizer()))
    add_lora_adapters(model, ALL_LINEAR)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # B starts at zero: give every factor an effect
                param.normal_(std=0.05)
    return model


def _vllm_split(lora: object, module_name: str, experts: int) -> tuple[list, list]:
    """vLLM's own split of a layer's fused expert factors into per-expert (w1, w2, w3), as its LoRA manager runs
    it when it packs the adapter (`enable_mixed_moe_lora_format`); the manager and the MoE layer are stand-ins
    holding only what the split reads."""
    from vllm.lora.model_manager import LoRAModelManager

    manager = types.SimpleNamespace(
        _get_lora_layer_weights=lambda model, name: model.get_lora(name),
        model=types.SimpleNamespace(config=types.SimpleNamespace(architectures=["Qwen3MoeForCausalLM"])),
    )
    layer = types.SimpleNamespace(local_num_experts=experts, global_num_experts=experts, ep_rank=0)
    LoRAModelManager._convert_3d_to_2d_moe_lora(manager, lora, layer, module_name)
    weights = lora.loras[module_name]
    return list(weights.lora_a), list(weights.lora_b)


def test_vllm_gives_every_expert_the_weight_change_peft_gives_it():
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    model = _adapted_tiny_moe()
    modules = dict(model.named_modules())
    gate_up, down = modules["model.layers.0.mlp.experts.base_layer"], modules["model.layers.0.mlp.experts"]
    # PEFT's nesting, which vLLM's split assumes: the gate_up wrapper inside the down_proj one.
    assert (gate_up.parameter_name, down.parameter_name) == ("gate_up_proj", "down_proj")
    delta_gate_up = gate_up.get_delta_weight(ADAPTER_NAME).float()  # [E, 2F, H], gate rows first
    delta_down = down.get_delta_weight(ADAPTER_NAME).float()  # [E, H, F]
    experts, width = delta_down.shape[0], delta_down.shape[2]

    # What the weight sync sends: the adapter factors under the trainer's names, renamed as register_adapter does.
    sent = {peft_tensor_name(n): p.detach().float().clone() for n, p in model.named_parameters() if "lora_" in n}
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=1, tensors=sent, peft_helper=PEFTHelper.from_dict(ALL_LINEAR.adapter_config()),
        device="cpu", dtype=torch.float32,
    )
    assert has_fused_expert_factors(list(lora.loras))
    assert {module_kind(n) for n in lora.loras} >= {"experts", "gate", "q_proj", "o_proj"}
    for weights in lora.loras.values():
        weights.optimize()  # folds alpha / r into B, as vLLM does before packing
    (a1, a2, a3), (b1, b2, b3) = _vllm_split(lora, "model.layers.0.mlp.experts", experts)
    assert a1.shape[1] == 2 * ALL_LINEAR.rank and a2.shape[1] == ALL_LINEAR.rank  # gate/up at 2r, down at r
    assert torch.allclose(torch.bmm(b1, a1), delta_gate_up[:, :width], atol=1e-6)  # gate (w1)
    assert torch.allclose(torch.bmm(b3, a3), delta_gate_up[:, width:], atol=1e-6)  # up (w3)
    assert torch.allclose(torch.bmm(b2, a2), delta_down, atol=1e-6)  # down (w2)
    assert delta_gate_up.abs().max() > 1e-3 and delta_down.abs().max() > 1e-3  # the check compares real changes


def test_the_engine_slot_holds_2r_and_splits_the_experts_only_when_they_are_adapted(tmp_path):
    moe = build_tiny_moe(tmp_path / "moe")
    dense = build_tiny_model(tmp_path / "dense")
    assert adapts_fused_experts(ALL_LINEAR, moe)
    assert engine_options(ALL_LINEAR, True) == {
        "enable_lora": True, "max_lora_rank": vllm_rank_slot(16), "max_loras": 1, "enable_mixed_moe_lora_format": True,
    }
    for spec, path in ((ATTENTION_AND_ROUTER, moe), (ALL_LINEAR, dense), (None, moe)):
        assert not adapts_fused_experts(spec, path)
    assert engine_options(ATTENTION_AND_ROUTER, False) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}


def test_the_plan_counts_vllms_per_expert_buffers_at_the_engine_slot(tmp_path):
    """The plan's adapter count for the engine equals the buffers the split factors fill: every module's A and B
    padded to the engine's one slot rank (vLLM allocates max_lora_rank for each)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    model = _adapted_tiny_moe()
    sent = {peft_tensor_name(n): p.detach().float().clone() for n, p in model.named_parameters() if "lora_" in n}
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=1, tensors=sent, peft_helper=PEFTHelper.from_dict(ALL_LINEAR.adapter_config()),
        device="cpu", dtype=torch.float32,
    )
    slot = vllm_rank_slot(2 * ALL_LINEAR.rank)
    layers = model.config.num_hidden_layers
    split = {f"model.layers.{i}.mlp.experts": _vllm_split(lora, f"model.layers.{i}.mlp.experts",
                                                          model.config.num_experts) for i in range(layers)}
    buffers = 0
    for name, weights in lora.loras.items():
        if name in split:
            a_list, b_list = split[name]  # per projection: A [E, rank, in], B [E, out, rank]
            buffers += sum(a.shape[0] * slot * (a.shape[2] + b.shape[1]) for a, b in zip(a_list, b_list))
        else:
            buffers += slot * (weights.lora_a.shape[1] + weights.lora_b.shape[0])
    shape = ModelShape.from_config(read_model_config(str(build_tiny_moe(tmp_path / "moe"))))
    targets = lora_targets("all-linear", None, shape.linear_names())
    assert engine_lora_params(shape, ALL_LINEAR.rank, targets) == buffers
