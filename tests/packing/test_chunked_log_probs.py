"""Log-probs and entropies from the LM head a chunk of tokens at a time equal those of the full logits (CPU,
float32, within 1e-5): values and gradients of the chunked function itself, and of tiny Qwen2 models through the
workers' padded and packed forwards and the PPO loss (tied and untied heads, gradient checkpointing, temperature,
LoRA). The memory side is in tests/trainer/test_memory_plan_terms.py, two ranks in tests/workers."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from protocol import DataProto
from tests.packing.test_packed_forward import BATCH, CONFIG, DEVICE
from workers.config import actor_rollout_ref_config
from workers.fsdp.sequences import response_log_probs_and_entropy
from workers.head_log_probs import (
    LabelScoringHead,
    logits_chunk_tokens,
    set_logits_chunk_tokens,
    token_log_probs_and_entropy,
)
from workers.lora.model import add_lora_adapters
from workers.lora.spec import LoraSpec
from workers.packing.forward import enable_packing
from workers.rl_math.chunked_logits import chunked_log_probs_and_entropy
from workers.rl_math.logits import entropy_from_logits, log_probs_from_logits
from workers.training.actor_loss import actor_loss_from_log_probs

TOKENS = (3, 37)  # 111 tokens: chunks of 7 leave 6 over, 111 is one exact chunk, 500 is more than all of them
CHUNKS = (1, 7, 111, 500)


def _head_inputs(seed: int = 0, dtype: torch.dtype = torch.float32, bias: bool = True):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*TOKENS, 16, generator=generator).to(dtype).requires_grad_(True)
    weight = (torch.randn(50, 16, generator=generator) / 2).to(dtype).requires_grad_(True)
    head_bias = torch.randn(50, generator=generator).to(dtype).requires_grad_(True) if bias else None
    labels = torch.randint(0, 50, TOKENS, generator=generator)
    return hidden, weight, head_bias, labels


def _full(hidden, weight, bias, labels, temperature, with_entropy=True):
    """The unchunked reference: full logits, then the workers' log_probs_from_logits / entropy_from_logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias) / temperature
    return log_probs_from_logits(logits, labels), entropy_from_logits(logits) if with_entropy else None


def _values_and_grads(fn, tensors, entropy_weight: float | None):
    """(log-probs, entropies, gradients of `tensors`) of a loss mixing both with fixed random weights."""
    for t in tensors:
        t.grad = None
    log_probs, entropy = fn()
    generator = torch.Generator().manual_seed(9)
    loss = (log_probs * torch.randn(log_probs.shape, generator=generator)).sum()
    if entropy_weight is not None:
        loss = loss + entropy_weight * (entropy * torch.randn(entropy.shape, generator=generator)).sum()
    loss.backward()
    return log_probs.detach(), None if entropy is None else entropy.detach(), [t.grad.clone() for t in tensors]


def _assert_same(got, want, atol=1e-5):
    for a, b in zip(got, want):
        if isinstance(a, list):
            _assert_same(a, b, atol)
        elif a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_chunked_values_and_gradients_equal_the_full_logits(chunk, temperature, with_entropy):
    hidden, weight, bias, labels = _head_inputs()
    tensors = [hidden, weight, bias]
    entropy_weight = 0.3 if with_entropy else None
    want = _values_and_grads(
        lambda: _full(hidden, weight, bias, labels, temperature, with_entropy), tensors, entropy_weight
    )
    got = _values_and_grads(
        lambda: chunked_log_probs_and_entropy(hidden, weight, bias, labels, temperature, chunk, with_entropy),
        tensors, entropy_weight,
    )
    assert got[0].shape == TOKENS and got[0].dtype == torch.float32
    assert float(got[2][0].abs().max()) > 1e-3 and float(got[2][1].abs().max()) > 1e-3  # gradients reach both
    _assert_same(got, want)


def test_an_entropy_only_reported_leaves_the_log_prob_gradient_unchanged():
    hidden, weight, _, labels = _head_inputs(bias=False)
    want = _values_and_grads(
        lambda: _full(hidden, weight, None, labels, 1.0, with_entropy=False), [hidden, weight], None
    )

    def reported():
        log_probs, entropy = chunked_log_probs_and_entropy(hidden, weight, None, labels, 1.0, 7)
        return log_probs, entropy.detach()

    got = _values_and_grads(reported, [hidden, weight], 0.3)
    _assert_same(got[2], want[2])
    assert got[1] is not None and not got[1].requires_grad


def test_banned_tokens_count_as_probability_zero():
    """-inf logits (a bias of -inf on two entries): the same values as the full logits, and finite gradients
    equal to those of an effectively -inf but finite bias (the full-logits entropy has no finite gradient there)."""
    hidden, weight, bias, labels = _head_inputs(seed=2)
    banned = torch.tensor([3, 11])
    labels = torch.where(torch.isin(labels, banned), 0, labels)
    with torch.no_grad():
        infinite, finite = bias.clone(), bias.clone()
        infinite[banned], finite[banned] = float("-inf"), -1e4
    infinite.requires_grad_(True)
    finite.requires_grad_(True)
    want = _values_and_grads(lambda: _full(hidden, weight, finite, labels, 0.7), [hidden, weight, finite], 0.3)
    got = _values_and_grads(
        lambda: chunked_log_probs_and_entropy(hidden, weight, infinite, labels, 0.7, 7), [hidden, weight, infinite], 0.3
    )
    _assert_same(got, want)
    with torch.no_grad():
        full_log_probs, full_entropy = _full(hidden, weight, infinite, labels, 0.7)
    _assert_same(got[:2], (full_log_probs, full_entropy))
    assert got[2][2][banned].eq(0).all()


def test_bfloat16_stays_within_the_noise_of_the_full_bfloat16_logits():
    """In bf16 both paths differ from the float32 result; the chunked one by no more than the full one does
    (plus a bf16 rounding)."""
    hidden, weight, bias, labels = _head_inputs(seed=3, dtype=torch.bfloat16)
    exact = _values_and_grads(lambda: _full(hidden.float(), weight.float(), bias.float(), labels, 0.7),
                              [hidden, weight, bias], 0.3)
    full = _values_and_grads(lambda: _full(hidden, weight, bias, labels, 0.7), [hidden, weight, bias], 0.3)
    chunked = _values_and_grads(
        lambda: chunked_log_probs_and_entropy(hidden, weight, bias, labels, 0.7, 7), [hidden, weight, bias], 0.3
    )
    pairs = [(chunked[0], full[0], exact[0]), (chunked[1], full[1], exact[1])]
    pairs += [(c, f, e) for c, f, e in zip(chunked[2], full[2], exact[2])]
    for got, noisy, want in pairs:
        error, noise = (got.float() - want.float()).abs().max(), (noisy.float() - want.float()).abs().max()
        assert error <= 2 * noise + 2 ** -7 * want.float().abs().max(), (error, noise)


def test_no_tokens_and_a_bad_chunk():
    hidden, weight = torch.zeros(0, 16, requires_grad=True), torch.randn(50, 16)
    no_labels = torch.zeros(0, dtype=torch.long)
    log_probs, entropy = chunked_log_probs_and_entropy(hidden, weight, None, no_labels)
    (log_probs.sum() + entropy.sum()).backward()
    assert log_probs.shape == entropy.shape == (0,) and hidden.grad.shape == (0, 16)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunked_log_probs_and_entropy(hidden, weight, None, no_labels, chunk_tokens=0)
    with pytest.raises(ValueError, match="logits_chunk_tokens must be an int >= 0"):
        set_logits_chunk_tokens(torch.nn.Linear(1, 1), -1)
    with pytest.raises(ValueError, match="model.logits_chunk_tokens"):
        actor_rollout_ref_config({"model": {"path": "unused", "logits_chunk_tokens": -2}})
    assert actor_rollout_ref_config({"model": {"path": "unused"}})["model"]["logits_chunk_tokens"] == 2048


# ---- through the workers' forwards of a tiny Qwen2 ---------------------------------------------------------------


def _model(tied: bool, packed: bool, checkpointing: bool, chunk: int, seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG, tie_word_embeddings=tied)).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    enable_packing(model, packed)
    set_logits_chunk_tokens(model, chunk)
    return model


def _update_batch() -> DataProto:
    generator = torch.Generator().manual_seed(4)
    shape = BATCH.batch["responses"].shape
    return DataProto.from_dict({
        **{key: BATCH.batch[key] for key in BATCH.batch.keys()},
        "old_log_probs": -4.0 + 0.5 * torch.randn(shape, generator=generator),
        "advantages": torch.randn(shape[0], 1, generator=generator).expand(shape).contiguous(),
        "ref_log_prob": -4.0 + 0.5 * torch.randn(shape, generator=generator),
    })


ACTOR = actor_rollout_ref_config(
    {"model": {"path": "unused"}, "actor": {"entropy_coeff": 0.01, "use_kl_loss": True}}
)["actor"]


def _ppo_step(model, temperature: float, actor_cfg=ACTOR):
    """Old log-probs and entropies (no grad), then one PPO micro-batch loss's gradients of every parameter."""
    data = _update_batch()
    mask = data.batch["response_mask"].bool()
    with torch.no_grad():
        log_probs, entropy = response_log_probs_and_entropy(model, data, DEVICE, temperature, True)
    model.zero_grad(set_to_none=True)
    entropy_grad = actor_cfg["entropy_coeff"] != 0
    log_probs_g, entropy_g = response_log_probs_and_entropy(model, data, DEVICE, temperature, True, entropy_grad)
    loss, _ = actor_loss_from_log_probs(log_probs_g, entropy_g, data, DEVICE, actor_cfg)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return log_probs[mask], entropy[mask], grads


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_workers_forwards_and_ppo_gradients_equal_the_full_logits(packed, tied, chunk):
    checkpointing = chunk == 5  # gradient checkpointing on with one of the chunk sizes
    full = _ppo_step(_model(tied, packed, checkpointing, 0), 0.7)
    chunked_model = _model(tied, packed, checkpointing, chunk)
    head = chunked_model.get_output_embeddings()
    chunked = _ppo_step(chunked_model, 0.7)
    assert chunked_model.get_output_embeddings() is head and isinstance(head, torch.nn.Linear)  # restored
    assert tied == (head.weight is chunked_model.get_input_embeddings().weight)
    assert sorted(chunked[2]) == sorted(full[2])
    assert tied or "lm_head.weight" in chunked[2]
    torch.testing.assert_close(chunked[0], full[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(chunked[1], full[1], atol=1e-5, rtol=0)
    for name, grad in full[2].items():
        torch.testing.assert_close(chunked[2][name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_an_update_without_entropy_bonus_and_the_reference_pass_equal_the_full_logits():
    actor_cfg = {**ACTOR, "entropy_coeff": 0.0, "use_kl_loss": False}
    full_model, chunked_model = _model(False, True, False, 0), _model(False, True, False, 4)
    full, chunked = _ppo_step(full_model, 1.0, actor_cfg), _ppo_step(chunked_model, 1.0, actor_cfg)
    for name, grad in full[2].items():
        torch.testing.assert_close(chunked[2][name], grad, atol=1e-5, rtol=1e-5, msg=name)
    with torch.no_grad():
        want, none = response_log_probs_and_entropy(full_model, BATCH, DEVICE, 1.0, with_entropy=False)
        got, also_none = response_log_probs_and_entropy(chunked_model, BATCH, DEVICE, 1.0, with_entropy=False)
    assert none is None and also_none is None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["q_proj", "lm_head"]], ids=["head frozen", "head adapted"])
def test_lora_adapter_gradients_equal_the_full_logits(targets):
    """A frozen head is scored in chunks; an adapted head (a peft LoRA layer, not a plain linear) falls back to
    its own forward and full logits; both give the full-logits gradients of the adapters."""
    spec = LoraSpec(rank=4, alpha=8, target_modules=tuple(targets), exclude_modules=None)
    results = []
    for chunk in (0, 3):
        model = _model(False, True, False, chunk)
        add_lora_adapters(model, spec)
        with torch.no_grad():  # B factors start at zero: move them so the adapters matter
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        results.append(_ppo_step(model, 0.7))
    (full_lp, full_ent, full_grads), (lp, ent, grads) = results
    assert full_grads and all("lora_" in name for name in full_grads)
    torch.testing.assert_close(lp, full_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, full_ent, atol=1e-5, rtol=0)
    for name, grad in full_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_the_head_is_restored_when_the_forward_fails():
    model = _model(False, False, False, 4)
    head = model.get_output_embeddings()
    ids = BATCH.batch["input_ids"]
    inputs = {"input_ids": ids, "attention_mask": BATCH.batch["attention_mask"], "use_cache": False}
    positions = torch.arange(ids.shape[1] - 1)
    with pytest.raises(ValueError, match="logits_to_keep must select exactly the positions"):
        token_log_probs_and_entropy(model, inputs, positions, ids, 1.0)  # one label more than the positions
    assert model.get_output_embeddings() is head
    assert not any(isinstance(m, LabelScoringHead) for m in model.modules())
    log_probs, _ = token_log_probs_and_entropy(model, inputs, positions, ids[:, 1:], 1.0, with_entropy=False)
    full = log_probs_from_logits(model(**inputs).logits[:, :-1], ids[:, 1:])
    torch.testing.assert_close(log_probs, full, atol=1e-5, rtol=0)
    assert logits_chunk_tokens(model) == 4 and logits_chunk_tokens(torch.nn.Linear(1, 1)) == 2048  # the default


def test_a_model_that_changes_its_head_output_is_refused_with_the_setting_to_change():
    """Gemma2 soft-caps its logits after the head: log-probs computed inside the head would skip that."""
    config = Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, final_logit_softcapping=30.0, pad_token_id=0,
    )
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(config).eval()
    with pytest.raises(ValueError, match="logits_chunk_tokens=0"):
        response_log_probs_and_entropy(model, BATCH, DEVICE, 1.0)
    set_logits_chunk_tokens(model, 0)
    log_probs, entropy = response_log_probs_and_entropy(model, BATCH, DEVICE, 1.0)
    assert torch.isfinite(log_probs).all() and torch.isfinite(entropy).all()
