"""trainer/flops.py against a hand computation and against torch's FlopCounterMode on a real tiny Qwen2, forward
and backward, full and LoRA."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer.flops import ModelFlops
from trainer.memory_plan.shape import ModelShape

# hidden 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128, vocabulary 100, untied head.
CONFIG = dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=100, tie_word_embeddings=False)
SHAPE = ModelShape.from_config(CONFIG)


def test_hand_computation():
    flops = ModelFlops(SHAPE)
    # One layer's weight matrices: q 64x64 + k 64x32 + v 64x32 + o 64x64 + gate 64x128 + up 64x128 + down 128x64
    # = 4096 + 2048 + 2048 + 4096 + 8192 + 8192 + 8192 = 36864 multiply-adds; 2 layers, 2 FLOPs each.
    assert flops.layers_per_token() == 147_456
    assert flops.head_per_token() == 2 * 64 * 100 == 12_800
    # Two sequences of 3 and 5 tokens: 8 tokens; causal pairs 3*4/2 + 5*6/2 = 6 + 15 = 21, each
    # 2 matmuls (QK, AV) x 2 FLOPs x 4 heads x 16 dims = 256 FLOPs, in 2 layers.
    forward = flops.forward([3, 5])
    assert forward.matmul == 8 * (147_456 + 12_800) == 1_282_048
    assert forward.attention == 21 * 256 * 2 == 10_752
    train = flops.train([3, 5])
    assert (train.matmul, train.attention) == (3 * 1_282_048, 3 * 10_752)
    # Generation: the layers over all 8 tokens once, the head over the 2 + 3 sampled tokens only.
    assert flops.generate([3, 5], [2, 3]).matmul == 8 * 147_456 + 5 * 12_800
    # The recomputed forward of gradient checkpointing: the layers again (not the head), attention again.
    assert flops.recompute([3, 5]).total == 8 * 147_456 + 10_752
    # A value head (critic) has one output instead of the vocabulary.
    assert ModelFlops(SHAPE, head="value").forward([3, 5]).matmul == 8 * (147_456 + 2 * 64)


def test_hand_computation_lora():
    # Rank 2 adapters on q (64 -> 64) and v (64 -> 32): 2*(64+64) + 2*(64+32) = 448 multiply-adds a layer.
    lora = ModelFlops(SHAPE, lora_rank=2, lora_targets=("q_proj", "v_proj"))
    assert lora.adapters_per_token() == 2 * 448 * 2 == 1_792
    assert lora.forward([3, 5]).matmul == 8 * (147_456 + 12_800 + 1_792)
    assert lora.forward([3, 5], adapters=False).matmul == 8 * (147_456 + 12_800)  # the reference: base alone
    # Frozen base: forward + activation gradients = 2x; adapters: 3x; attention (no weights): 3x.
    train = lora.train([3, 5])
    assert train.matmul == 2 * 8 * (147_456 + 12_800) + 3 * 8 * 1_792
    assert train.attention == 3 * 10_752


def _qwen2(attention: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**{k: v for k, v in CONFIG.items() if k != "model_type"}, attn_implementation=attention)
    return Qwen2ForCausalLM(config).float()


def _counted(model: torch.nn.Module, ids: torch.Tensor) -> tuple[dict[str, int], dict[str, int]]:
    """FlopCounterMode's FLOPs by op for the forward, and for the backward, of one loss on `ids`."""
    with FlopCounterMode(display=False) as forward_counter:
        logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    with FlopCounterMode(display=False) as backward_counter:
        loss.backward()

    def by_op(counter: FlopCounterMode) -> dict[str, int]:
        return {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}

    return by_op(forward_counter), by_op(backward_counter)


def test_matches_torch_flop_counter_eager_attention():
    """Weight matmuls (aten mm/addmm) agree exactly, forward and backward. Eager attention (aten bmm) computes
    every (query, key) pair and masks the upper triangle afterwards, so the counter sees L x L pairs where the
    model FLOPs count the causal L(L+1)/2: exactly 2L/(L+1) of the counter's figure."""
    batch, length = 2, 16
    ids = torch.randint(0, CONFIG["vocab_size"], (batch, length))
    forward, backward = _counted(_qwen2("eager"), ids)
    flops = ModelFlops(SHAPE)
    ours = flops.forward([length] * batch)
    assert forward["mm"] + forward.get("addmm", 0) == ours.matmul
    causal_share = (length + 1) / (2 * length)
    assert forward["bmm"] * causal_share == pytest.approx(ours.attention, rel=1e-12)
    train = flops.train([length] * batch)
    assert forward["mm"] + forward.get("addmm", 0) + backward["mm"] + backward.get("addmm", 0) == train.matmul
    assert (forward["bmm"] + backward["bmm"]) * causal_share == pytest.approx(train.attention, rel=1e-12)
    counter_total = sum(forward.values()) + sum(backward.values())
    assert train.total == pytest.approx(counter_total - train.attention * (1 / causal_share - 1), rel=1e-12)


def test_matches_torch_flop_counter_sdpa_on_cpu():
    """With SDPA the counter sees only the weight matmuls on CPU (it has no formula for the CPU flash kernel):
    its whole count is ours less the attention term, 2.6% of ours at this size and 16 tokens."""
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16))
    forward, backward = _counted(_qwen2("sdpa"), ids)
    train = ModelFlops(SHAPE).train([16, 16])
    counter_total = sum(forward.values()) + sum(backward.values())
    assert counter_total == train.matmul
    assert 0 < 1 - counter_total / train.total < 0.03


def test_lora_matches_torch_flop_counter():
    """LoRA on every decoder linear, the base frozen: the counter's weight matmuls forward + backward equal the
    count (base 2x, adapters 3x) when activation gradients reach the first layer, as with gradient checkpointing
    (`enable_input_require_grads`, which PEFT models use there)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_qwen2("sdpa"), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    model.enable_input_require_grads()
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16))
    forward, backward = _counted(model, ids)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lora = ModelFlops(SHAPE, lora_rank=4, lora_targets=targets)
    assert sum(forward.values()) == lora.forward([16, 16]).matmul
    assert sum(forward.values()) + sum(backward.values()) == lora.train([16, 16]).matmul
    full = ModelFlops(SHAPE).train([16, 16]).matmul
    assert lora.train([16, 16]).matmul < full  # the frozen base saves its weight gradients


def test_sequences_count_by_their_own_length():
    """Padding is not work: a batch's attention term is the sum over its sequences, not max length squared."""
    flops = ModelFlops(SHAPE)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    lengths = mask.sum(-1).tolist()
    assert flops.forward(lengths).attention == flops.attention([4]) + flops.attention([6])
    assert flops.forward(lengths).attention < flops.forward([6, 6]).attention
