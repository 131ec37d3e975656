"""The memory plan and FLOP counts of mixture-of-experts models (Qwen3-MoE, Qwen2-MoE): parameter counts against
transformers' models and PEFT's adapters, saved-for-backward bytes against autograd's saved tensors, a tiny
Qwen3-MoE's forward/backward peaks against torch's accounting, and the Qwen3-30B-A3B plan on four H200s."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, Qwen2MoeConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

from benchmarks.model_shapes import QWEN3_30B_A3B
from tests.trainer.memory_plan_cases import GIB, plan_of
from tests.trainer.test_memory_plan_terms import _peak_without_params, _per_token_saved
from trainer.config_loader import load_config
from trainer.flops import ModelFlops
from trainer.memory_plan import terms
from trainer.memory_plan.shape import ModelShape, lora_params, lora_targets
from trainer.tiny_model import build_char_tokenizer, seeded_model

SMALL = dict(vocab_size=64, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
             num_experts_per_tok=2, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1)
CONFIGS = {
    "qwen3_moe, a dense layer, renormalized top-k": Qwen3MoeConfig(**SMALL, head_dim=64, mlp_only_layers=[1],
                                                                  norm_topk_prob=True),
    "qwen2_moe, shared expert, every other layer sparse": Qwen2MoeConfig(
        **SMALL, shared_expert_intermediate_size=192, decoder_sparse_step=2, tie_word_embeddings=True),
}


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_and_adapter_counts_equal_transformers_and_peft(name):
    config = CONFIGS[name]
    shape = ModelShape.from_config(config.to_dict())
    assert shape.exact and shape.moe is not None
    with torch.device("meta"):
        assert shape.total_params() == _count(AutoModelForCausalLM.from_config(config))
    # Qwen3-MoE: PEFT adapts the experts and the router too; Qwen2-MoE: the shared expert and its gate.
    for targets in ("all-linear", ["q_proj", "v_proj"], ["q_proj", "gate_proj", "up_proj", "down_proj"]):
        peft = get_peft_model(AutoModelForCausalLM.from_config(config), LoraConfig(r=4, target_modules=targets))
        trainable = sum(p.numel() for p in peft.parameters() if p.requires_grad)
        assert lora_params(shape, 4, lora_targets(targets, None, shape.linear_names())) == trainable, targets


@pytest.mark.parametrize("name", list(CONFIGS))
def test_saved_activations_equal_autograds_saved_tensors(name):
    """The grouped_mm experts path (transformers' default) and the router, full training and LoRA."""
    config = CONFIGS[name]
    shape = ModelShape.from_config(config.to_dict())
    for dtype in (torch.bfloat16, torch.float32):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).to(dtype).train()
        assert model.config._experts_implementation == "grouped_mm"
        e = torch.finfo(dtype).bits // 8
        assert _per_token_saved(model) == terms.model_saved_bytes(shape, e, False, kv_repeated=False) - 8
    base = AutoModelForCausalLM.from_config(config).requires_grad_(False)
    model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    model = model.to(torch.bfloat16).train()
    train = terms.Trainability(full=False, lora_rank=8, lora_targets=("q_proj", "v_proj"))
    assert _per_token_saved(model) == terms.model_saved_bytes(shape, 2, False, train, kv_repeated=False) - 8


def test_a_tiny_qwen3_moe_peaks_within_15_percent_of_torchs_accounting():
    """The tiny model of the MoE runs (trainer/tiny_model.py's tokenizer), bf16 on CPU: the training step's peak
    without and with gradient checkpointing, and a no-grad forward's (measured within 5% when written)."""
    from workers.fsdp.model_loading import enable_gradient_checkpointing

    tokenizer = build_char_tokenizer()
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                            num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=64, tie_word_embeddings=True)
    shape = ModelShape.from_config(config.to_dict())
    rows, length = 4, 128
    ids = torch.randint(0, len(tokenizer), (rows, length), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(length).expand(rows, length)
    for checkpointing in (False, True):
        model = seeded_model(Qwen3MoeForCausalLM, config, tokenizer, 0).to(torch.bfloat16).train()
        if checkpointing:
            enable_gradient_checkpointing(model, None)

        def train_step():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                model.model(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state.sum().backward()

        measured = _peak_without_params(model, train_step) / (rows * length)
        expected = terms.model_saved_bytes(shape, 2, checkpointing, kv_repeated=False)
        expected += terms.backward_peak_bytes(shape, 2, checkpointing, kv_repeated=False)
        assert abs(measured / expected - 1) < 0.15, (checkpointing, measured, expected)
    model.zero_grad(set_to_none=True)

    def forward():
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            model.model(input_ids=ids, position_ids=positions, use_cache=False)

    measured = _peak_without_params(model, forward) / (rows * length)
    assert abs(measured / terms.forward_peak_bytes(shape, 2) - 1) < 0.15


@pytest.fixture(scope="module")
def qwen3_30b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3_30b_a3b")
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    return str(folder)


def _four_h200s(model: str, *extra: str):
    """The plan's defaults, four GPUs, a vLLM engine, H200s."""
    return plan_of(load_config([f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=4",
                                "actor_rollout_ref.rollout.name=vllm", *extra]), gib=141)


def test_qwen3_30b_a3b_counts_every_expert_in_its_state_and_the_active_ones_in_its_flops(qwen3_30b):
    shape = ModelShape.from_config(QWEN3_30B_A3B)
    assert 30.4e9 < shape.total_params() < 30.6e9
    assert shape.largest_tensor() == 128 * 2 * 768 * 2048  # the experts' gate_up_proj of one layer
    # MFU by active parameters: the layers' matmuls of ~3.3B active parameters (less the embedding), not 30.5B.
    active = ModelFlops(shape).layers_per_token() / 2 + shape.embedding_params() + shape.head_params()
    assert 3.2e9 < active < 3.5e9
    full = _four_h200s(qwen3_30b)
    update = full.row("update_actor").parts
    actor_state = 16 * shape.total_params() / 4  # float32 weights, gradients and AdamW's two moments, over 4 GPUs
    assert update["optimizer"] == pytest.approx(8 * shape.total_params() / 4, rel=1e-6)
    assert 120e9 < actor_state < 124e9
    assert update["weights"] + update["grads"] + update["optimizer"] > actor_state
    assert full.fits() is False
    # the engine's share holds its base, rank-128 adapter slots (12.6 GiB) and vLLM's start-up profile: 0.5 leaves
    # its KV cache nothing, 0.55 holds every sequence of the step
    lora = _four_h200s(qwen3_30b, "+actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.rollout.gpu_memory_utilization=0.55")
    adapters = lora_params(shape, 64, lora_targets("all-linear", None, shape.linear_names()))
    assert 3.9e9 < adapters < 4.1e9  # rank 64 on attention, router and every expert (PEFT's layout)
    assert lora.row("update_actor").parts["optimizer"] == pytest.approx(8 * adapters / 4, rel=1e-3)
    assert lora.fits() is True and lora.peak()[1].total < 100 * GIB
