"""A mixture of experts' LoRA base shared with its engine, without vLLM: an FSDP2-sharded LoRA Qwen3-MoE (CPU, gloo,
one rank, every linear adapted, the fused experts too) pointed into an engine-like module tree laid out as vLLM's
fused-MoE layer holds the experts (`w13_weight` [E, gate rows then up rows, H], `w2_weight` [E, H, F]), read by
the same `checkpoint_views` the vLLM worker runs. Every base tensor is shared, the experts included, wherever
the engine keeps its fused-MoE layer; experts in another layout stay the trainer's, with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from tests.offload.tiny import local, sharded_lora, train_step
from workers.fsdp.shared_base import SharedBase, checkpoint_name
from workers.lora.spec import LoraSpec, is_adapter_parameter
from workers.rollout.vllm_base_views import checkpoint_views
from workers.training.dist_utils import single_process_group

CPU = torch.device("cpu")
MOE = dict(vocab_size=67, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           head_dim=8, intermediate_size=48, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
           decoder_sparse_step=1, max_position_embeddings=64, tie_word_embeddings=False)
SPEC = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear", exclude_modules=None)
EXPERT_LEAVES = {"gate_up_proj": "w13_weight", "down_proj": "w2_weight"}


@pytest.fixture(scope="module")
def process_group():
    with single_process_group(CPU):
        yield


def lora_moe(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    return sharded_lora(Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE, attn_implementation="eager")), SPEC)


def base_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {checkpoint_name(n): local(p).detach() for n, p in model.named_parameters() if not is_adapter_parameter(n)}


def engine_like(model: nn.Module, experts_child: str = "", expert_rows: int | None = None) -> nn.Module:
    """A module tree holding copies of the base as vLLM names it: each layer's fused experts as one fused-MoE
    module's `w13_weight` / `w2_weight` at `mlp.experts` (or its child `experts_child`), the rest as they are.
    `expert_rows`: keep only this many rows of each expert's gate+up (a layout the trainer's shard is not)."""
    root = nn.Module()
    for name, tensor in base_tensors(model).items():
        owner, _, leaf = name.rpartition(".")
        if leaf in EXPERT_LEAVES:
            owner = f"{owner}.{experts_child}" if experts_child else owner
            leaf = EXPERT_LEAVES[leaf]
            if expert_rows is not None and leaf == "w13_weight":
                tensor = tensor[:, :expert_rows]
        module = root
        for part in owner.split("."):
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, nn.Parameter(tensor.clone(), requires_grad=False))
    return root


@pytest.mark.parametrize("experts_child", ["", "routed_experts"])
def test_the_fused_experts_are_shared_with_the_rest_of_the_base(process_group, experts_child):
    model, _ = lora_moe()
    before = base_tensors(model)
    expert_names = [n for n in before if n.rpartition(".")[2] in EXPERT_LEAVES]
    assert len(expert_names) == 2 * MOE["num_hidden_layers"]  # gate_up_proj and down_proj of every layer
    views = checkpoint_views(engine_like(model, experts_child))
    report = SharedBase(model).attach(views)
    assert report.unshared == {} and report.fraction == 1.0
    for name, param in model.named_parameters():
        if not is_adapter_parameter(name):
            assert local(param).data_ptr() == views[checkpoint_name(name)].data_ptr(), name
            assert torch.equal(local(param), before[checkpoint_name(name)]), name


def test_experts_in_another_layout_stay_the_trainers_with_the_reason(process_group):
    """An engine splitting each expert's width (as tensor parallelism does) holds other shapes: those are left."""
    model, _ = lora_moe()
    half = MOE["moe_intermediate_size"]  # half of each expert's gate+up rows
    report = SharedBase(model).attach(checkpoint_views(engine_like(model, expert_rows=half)))
    unshared = {checkpoint_name(n) for n in report.unshared}
    assert unshared == {f"model.layers.{i}.mlp.experts.gate_up_proj" for i in range(MOE["num_hidden_layers"])}
    assert all("shape" in why and "in the engine" in why for why in report.unshared.values())
    assert 0.0 < report.fraction < 1.0


def test_a_lora_step_on_shared_experts_equals_one_on_the_own_base(process_group):
    own, own_optimizer = lora_moe(seed=3)
    shared, shared_optimizer = lora_moe(seed=3)
    engine = engine_like(shared)
    SharedBase(shared).attach(checkpoint_views(engine))
    engine_before = [p.clone() for p in engine.parameters()]
    for seed in range(2):
        assert train_step(own, own_optimizer, seed) == train_step(shared, shared_optimizer, seed)
    assert all(torch.equal(a, b) for a, b in zip(engine_before, engine.parameters()))  # training never writes the base
