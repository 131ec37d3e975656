"""HF <-> Megatron GPT layouts: exact round trips through every TP/PP split, the fused layouts mean what
Megatron computes with them, and sizes that cannot be split are named."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.megatron.moe_models import per_expert_state, qwen3_moe
from workers.megatron.convert import gather_tp, hf_to_megatron, megatron_to_hf, merge_pp, shard_tp, split_pp
from workers.megatron.layout import layout_from_hf_config

SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, vocab_size=100, max_position_embeddings=64)


def _model(kind: str, tied: bool):
    torch.manual_seed(0)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**SMALL, tie_word_embeddings=tied))
    return LlamaForCausalLM(LlamaConfig(**SMALL, tie_word_embeddings=tied))


@pytest.mark.parametrize("kind, tied", [("qwen2", False), ("qwen2", True), ("llama", False)])
@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (2, 2), (2, 4)])
def test_round_trip_through_tp_and_pp_splits_is_exact(kind, tied, tp, pp):
    model = _model(kind, tied)
    hf = {n: p.detach().clone() for n, p in model.named_parameters()}
    layout = layout_from_hf_config(model.config, tp=tp, pp=pp)
    mc = hf_to_megatron(hf, layout)
    assert mc["embedding.word_embeddings.weight"].shape[0] == layout.padded_vocab_size == 128 * tp
    stages_per_rank = [split_pp(shard, layout, pp) for shard in shard_tp(mc, tp)]
    for rank_stages in stages_per_rank:
        assert all(f"decoder.layers.{4 // pp - 1}.mlp.linear_fc2.weight" in stage for stage in rank_stages)
    merged = [merge_pp(rank_stages, layout) for rank_stages in stages_per_rank]
    back = megatron_to_hf(gather_tp(merged), layout)
    assert sorted(back) == sorted(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_fused_layouts_compute_what_the_hf_projections_compute():
    model = _model("qwen2", False)
    layout = layout_from_hf_config(model.config, tp=2)
    mc = hf_to_megatron({n: p.detach() for n, p in model.named_parameters()}, layout)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    x = torch.randn(5, layout.hidden_size)
    heads, hd, groups, per = layout.num_heads, layout.head_dim, layout.num_kv_heads, layout.heads_per_group
    with torch.no_grad():
        q_hf, k_hf, v_hf = attn.q_proj(x).view(5, heads, hd), attn.k_proj(x).view(5, groups, hd), attn.v_proj(x).view(5, groups, hd)
        for rank, shard in enumerate(shard_tp(mc, 2)):
            # As Megatron does on a TP rank: [tokens, local groups, (per + 2) * hd] -> q, k, v per group.
            w, b = shard["decoder.layers.0.self_attention.linear_qkv.weight"], shard["decoder.layers.0.self_attention.linear_qkv.bias"]
            local_groups = groups // 2
            mixed = (x @ w.T + b).view(5, local_groups, (per + 2) * hd)
            q, k, v = torch.split(mixed, [per * hd, hd, hd], dim=2)
            first = rank * local_groups
            torch.testing.assert_close(q.reshape(5, local_groups * per, hd), q_hf[:, first * per : (first + local_groups) * per])
            torch.testing.assert_close(k, k_hf[:, first : first + local_groups])
            torch.testing.assert_close(v, v_hf[:, first : first + local_groups])
            # SwiGLU on the rank's fc1 output: its first half is its gate slice, the second its up slice.
            inter = layout.ffn_hidden_size // 2
            gate, up = torch.chunk(x @ shard["decoder.layers.0.mlp.linear_fc1.weight"].T, 2, dim=-1)
            torch.testing.assert_close(gate, mlp.gate_proj(x)[:, rank * inter : (rank + 1) * inter])
            torch.testing.assert_close(up, mlp.up_proj(x)[:, rank * inter : (rank + 1) * inter])


def test_sizes_that_cannot_be_split_are_named_with_the_valid_choices():
    config = _model("qwen2", False).config
    with pytest.raises(ValueError, match=r"tensor parallel size 3 must divide the number of attention heads \(4\)") as error:
        layout_from_hf_config(config, tp=3)
    assert "valid TP sizes for this model: [1, 2]" in str(error.value)
    with pytest.raises(ValueError, match=r"pipeline parallel size 3 must divide the number of layers \(4\)"):
        layout_from_hf_config(config, pp=3)
    with pytest.raises(ValueError, match=r"must divide the number of key/value heads \(2\)"):
        layout_from_hf_config(config, tp=4)
    config.model_type = "gpt2"
    with pytest.raises(ValueError, match=r"model_type 'gpt2' is not supported .* \['qwen2', 'llama', 'qwen3', 'qwen3_moe'\]"):
        layout_from_hf_config(config)


@pytest.mark.parametrize("tp, pp, ep", [(1, 1, 1), (1, 1, 2), (2, 1, 2), (2, 2, 4), (1, 2, 2)])
def test_moe_round_trip_through_tp_pp_and_ep_splits_is_exact(tp, pp, ep):
    from workers.megatron.moe import select_ep

    model = qwen3_moe()
    hf = per_expert_state(model)
    layout = layout_from_hf_config(model.config, tp=tp, pp=pp, ep=ep)
    assert layout.qk_layernorm and layout.moe.num_experts == 4 and layout.moe.ffn_hidden_size == 32
    mc = hf_to_megatron(hf, layout)
    per = 4 // ep
    pieces = [select_ep(mc, layout.moe, ep, r) for r in range(ep)]
    for r, piece in enumerate(pieces):
        local = sorted({n.split("local_experts.")[1].split(".")[0] for n in piece if "local_experts" in n})
        assert local == [str(j) for j in range(per)]
        # Local expert j of EP rank r is global expert r * E/EP + j.
        assert torch.equal(
            piece["decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight"],
            hf[f"model.layers.1.mlp.experts.{r * per}.down_proj.weight"],
        )
    # Back: TP gather and PP merge per EP rank, then the experts renumbered globally.
    back_mc = {}
    for r, piece in enumerate(pieces):
        merged = gather_tp([merge_pp(split_pp(shard, layout, pp), layout) for shard in shard_tp(piece, tp)])
        for name, tensor in merged.items():
            if "local_experts." in name:
                head, tail = name.split("local_experts.")
                j, rest = tail.split(".", 1)
                name = f"{head}local_experts.{r * per + int(j)}.{rest}"
            back_mc[name] = tensor
    back = megatron_to_hf(back_mc, layout)
    assert sorted(back) == sorted(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


def test_expert_fc1_shards_compute_the_experts_gate_and_up_per_tp_rank():
    model = qwen3_moe()
    layout = layout_from_hf_config(model.config, tp=2)
    hf = per_expert_state(model)
    x = torch.randn(5, 64)
    for rank, shard in enumerate(shard_tp(hf_to_megatron(hf, layout), 2)):
        gate, up = torch.chunk(x @ shard["decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"].T, 2, dim=-1)
        rows = slice(rank * 16, (rank + 1) * 16)
        torch.testing.assert_close(gate, x @ hf["model.layers.0.mlp.experts.3.gate_proj.weight"][rows].T)
        torch.testing.assert_close(up, x @ hf["model.layers.0.mlp.experts.3.up_proj.weight"][rows].T)
        assert torch.equal(shard["decoder.layers.0.mlp.router.weight"], hf["model.layers.0.mlp.gate.weight"])


def test_expert_parallel_sizes_that_cannot_split_are_named():
    config = qwen3_moe().config
    with pytest.raises(ValueError, match=r"expert_model_parallel_size 3 must divide the number of experts \(4\); valid EP sizes: \[1, 2, 4\]"):
        layout_from_hf_config(config, ep=3)
    dense = _model("qwen2", False).config
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=2 needs a mixture-of-experts model; model_type 'qwen2' is dense"):
        layout_from_hf_config(dense, ep=2)
    assert layout_from_hf_config(dense).moe is None
    assert layout_from_hf_config(config, tp=2, ep=2, etp=1).moe.num_experts == 4  # parallel folding
    assert layout_from_hf_config(dense, tp=2, etp=1).moe is None  # a dense model has no experts to lay out
    with pytest.raises(ValueError, match=r"expert tensor parallel size 3 must divide the expert MLP size \(32\)"):
        layout_from_hf_config(config, ep=2, etp=3)


@pytest.mark.parametrize("pp", [1, 2])
def test_the_sync_plan_names_every_hf_tensor_of_the_stream_once_with_its_shape(pp):
    """`hf_stream_specs` (a separate engine's bucket plan follows it) lists each HF tensor of the mixture of experts
    once, per expert, with the checkpoint's shapes; stage 0's layers come before stage 1's."""
    from workers.megatron.export import hf_stream_specs

    model = qwen3_moe()
    hf = per_expert_state(model)
    specs = hf_stream_specs(layout_from_hf_config(model.config, pp=pp), pp)
    assert len(specs) == len({name for name, _ in specs}) == len(hf)
    assert {name: shape for name, shape in specs} == {name: tuple(t.shape) for name, t in hf.items()}
    layers = [int(name.split(".")[2]) for name, _ in specs if name.startswith("model.layers.")]
    assert layers == sorted(layers)
