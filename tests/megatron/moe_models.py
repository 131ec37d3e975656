"""Small Qwen3-MoE models for the Megatron tests, and their weights under the per-expert names checkpoints hold."""

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def qwen3_moe(
    folder=None, norm_topk_prob: bool = True, tied: bool = False, layers: int = 4, experts: int = 4
) -> Qwen3MoeForCausalLM:
    """`experts` experts of width 32, 2 active; 4 query / 2 key-value heads (so TP=2 splits them); saved to `folder` if
    given."""
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=experts,
        num_experts_per_tok=2, norm_topk_prob=norm_topk_prob, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=tied, dtype="float32",
        pad_token_id=0,
    )
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # routers start near uniform; spread them so top-2 choices are clear-cut
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(std=0.5)
    if folder is not None:
        model.save_pretrained(folder)
    return model


def per_expert_state(model: Qwen3MoeForCausalLM) -> dict[str, torch.Tensor]:
    """The model's tensors under checkpoint names: transformers fuses the experts in memory
    (`mlp.experts.gate_up_proj` [E, 2F, H] = per expert [gate; up], `mlp.experts.down_proj` [E, H, F])."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for e, fused in enumerate(tensor):
                gate, up = torch.chunk(fused, 2, dim=0)
                out[f"{prefix}{e}.gate_proj.weight"], out[f"{prefix}{e}.up_proj.weight"] = gate.clone(), up.clone()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e, down in enumerate(tensor):
                out[f"{prefix}{e}.down_proj.weight"] = down.clone()
        else:
            out[name] = tensor.clone()
    return out
