"""The trainer side of a LoRA base shared with an engine of tensor parallel 2, one shard per rank, without vLLM: a
LoRA Qwen2 sharded with FSDP2 over two ranks (torch's in-process fake backend stands for them; each rank is built in
turn) with `row_parallel_placement`, whose frozen base is pointed at tensors cut as vLLM's shard r holds them
(column-parallel rows, o_proj and down_proj's input columns, the norms whole). Every base shard is then that rank's
engine tensor itself, or a window of a norm, with the values it had."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.offload.tiny import local
from workers.fsdp.model_loading import transformer_layers
from workers.fsdp.shared_base import ROW_PARALLEL_LINEARS, SharedBase, checkpoint_name, row_parallel_placement
from workers.fsdp.wrap import shard_in_units
from workers.lora.model import add_lora_adapters
from workers.lora.spec import LoraSpec, is_adapter_parameter

CPU = torch.device("cpu")
TP = 2
# Every split even over 2 ranks, as vLLM requires of a tensor-parallel model (heads, KV heads, MLP, vocabulary).
CONFIG = dict(vocab_size=64, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, max_position_embeddings=64, tie_word_embeddings=False)
SPEC = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear", exclude_modules=None)


def _engine_shard(base: dict[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """Checkpoint name -> what vLLM's shard `rank` holds of it: a copy of its part (rows, or input columns of the
    row-parallel linears), or the whole tensor where vLLM replicates it (norms, row-parallel biases)."""
    shard: dict[str, torch.Tensor] = {}
    for name, tensor in base.items():
        owner, _, leaf = name.rpartition(".")
        if owner.rpartition(".")[2] in ROW_PARALLEL_LINEARS and leaf == "weight":
            shard[name] = tensor.chunk(TP, dim=1)[rank].contiguous().clone()
        elif tensor.dim() == 2 or owner.endswith(("_proj",)):
            shard[name] = tensor.chunk(TP, dim=0)[rank].contiguous().clone()
        else:
            shard[name] = tensor.clone()
    return shard


def _lora_model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG, attn_implementation="eager"))
    add_lora_adapters(model, SPEC)
    return model


@pytest.mark.parametrize("rank", range(TP))
def test_each_base_shard_is_its_engine_shards_tensor(rank):
    assert not dist.is_initialized(), "this test starts and ends its own process group"
    model = _lora_model()
    base = {checkpoint_name(n): p.detach().clone() for n, p in model.named_parameters() if not is_adapter_parameter(n)}
    engine = _engine_shard(base, rank)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=TP)
    try:
        placement = row_parallel_placement(model)
        shard_in_units(model, transformer_layers(model), CPU, None, -1, placement)
        dims = {checkpoint_name(n): p.placements[0].dim for n, p in model.named_parameters()}
        assert dims["model.layers.0.self_attn.o_proj.weight"] == dims["model.layers.1.mlp.down_proj.weight"] == 1
        assert dims["model.layers.0.self_attn.q_proj.weight"] == dims["model.embed_tokens.weight"] == 0
        assert all(dim == 0 for name, dim in dims.items() if ".lora_" in name)  # the adapters train: FSDP's default
        before = {n: local(p).detach().clone() for n, p in model.named_parameters()}
        report = SharedBase(model).attach(engine)
        assert report.unshared == {} and report.fraction == 1.0
        for name, param in model.named_parameters():
            assert torch.equal(local(param), before[name]), name
            if is_adapter_parameter(name):
                continue
            tensor = engine[checkpoint_name(name)]
            if tensor.shape == local(param).shape:  # the engine shard's tensor itself
                assert local(param).data_ptr() == tensor.data_ptr(), name
            else:  # a norm: this rank's window of the whole tensor the shard holds
                assert tensor.shape == base[checkpoint_name(name)].shape
                assert local(param).untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr(), name
    finally:
        dist.destroy_process_group()
