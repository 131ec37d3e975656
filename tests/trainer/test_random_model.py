"""benchmarks/random_model.py: the folder is the same whatever number of writers shares its shards, and it loads
in transformers with every parameter of the shape. The writers' shares are written here in this process (a child
process per writer costs ~20 s of imports on CI); the GPU runs start them as processes."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from benchmarks.model_shapes import QWEN2_0_5B
from benchmarks.random_model import write_config, write_random_model, write_shards

SHAPE = dict(QWEN2_0_5B, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=512, tie_word_embeddings=False)


def test_two_writers_write_the_folder_one_writer_writes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    write_random_model(one, SHAPE, seed=5, shard_gib=0.00005, writers=1)
    config = write_config(two, SHAPE)
    for writer in range(2):  # what the two writer processes do, one after the other
        write_shards(two, config, seed=5, shard_gib=0.00005, writer=writer, writers=2)
    index = json.loads((one / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2  # several shards, so both writers wrote some
    assert sorted(p.name for p in two.glob("*.safetensors")) == files
    for file in files:
        a, b = load_file(one / file), load_file(two / file)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[name], b[name]) for name in a)
    # a different seed draws different matrices
    write_random_model(tmp_path / "other", SHAPE, seed=6, shard_gib=0.00005, writers=1)
    name = "model.layers.0.mlp.up_proj.weight"
    file = index["weight_map"][name]
    assert not torch.equal(load_file(one / file)[name], load_file(tmp_path / "other" / file)[name])


def test_the_folder_loads_with_every_parameter(tmp_path):
    from transformers import AutoModelForCausalLM

    params = write_random_model(tmp_path, SHAPE, seed=0, shard_gib=0.00005, writers=1)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert sum(p.numel() for p in model.parameters()) == params
    assert torch.all(model.model.norm.weight == 1)
    assert model.model.layers[0].self_attn.q_proj.weight.std().item() > 0


def test_a_mixture_of_experts_folder_holds_per_expert_tensors_and_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    shape = dict(SHAPE, model_type="qwen3_moe", head_dim=16, moe_intermediate_size=32, num_experts=4,
                 num_experts_per_tok=2)
    params = write_random_model(tmp_path, shape, seed=0, shard_gib=0.00005, writers=1)
    names = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    # vLLM's loader reads the per-expert names a checkpoint holds, not transformers' fused in-memory tensors
    assert "model.layers.2.mlp.experts.3.down_proj.weight" in names
    assert not any(name.endswith("gate_up_proj") for name in names)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.config.architectures == ["Qwen3MoeForCausalLM"]
    assert sum(p.numel() for p in model.parameters()) == params
    name = "model.layers.2.mlp.experts.3.down_proj.weight"
    drawn = load_file(tmp_path / names[name])[name]
    assert torch.equal(model.model.layers[2].mlp.experts.down_proj[3], drawn)  # loaded, not initialised anew
