"""Packed (padding-free) forwards equal the padded ones on CPU in fp32: log-probs, entropies, values, scores."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification, Qwen2ForTokenClassification

from protocol import DataProto
from workers.fsdp.sequences import response_log_probs_and_entropy, response_scores, response_values
from workers.packing.attention import per_sequence_attention
from workers.packing.forward import enable_packing, is_packed
from workers.packing.layout import PackedRows

CONFIG = dict(
    vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
)
PROMPT, RESPONSE = 9, 12


def rollout_batch(prompt_lengths: list[int], response_lengths: list[int], seed: int = 0) -> DataProto:
    """Left-padded prompts + right-padded responses, the layout the rollout produces."""
    generator = torch.Generator().manual_seed(seed)
    rows = len(prompt_lengths)
    input_ids = torch.zeros(rows, PROMPT + RESPONSE, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        input_ids[i, PROMPT - p : PROMPT + r] = torch.randint(2, 64, (p + r,), generator=generator)
        mask[i, PROMPT - p : PROMPT + r] = 1
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids,
        "responses": input_ids[:, PROMPT:], "response_mask": mask[:, PROMPT:],
    })


def model_pair(cls: type, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same random model twice: padded (sdpa) and packed."""
    torch.manual_seed(seed)
    padded = cls(Qwen2Config(**CONFIG, num_labels=1)).eval()
    packed = cls(Qwen2Config(**CONFIG, num_labels=1)).eval()
    packed.load_state_dict(padded.state_dict())
    assert enable_packing(packed, None) and is_packed(packed) and not is_packed(padded)
    return padded, packed


BATCH = rollout_batch([9, 3, 6, 1, 7], [12, 1, 5, 9, 0])
DEVICE = torch.device("cpu")


def test_layout_round_trip_and_offsets():
    rows = PackedRows.from_padded(BATCH.batch["input_ids"], BATCH.batch["attention_mask"], BATCH.batch["position_ids"])
    lengths = BATCH.batch["attention_mask"].sum(1)
    assert rows.num_tokens == int(lengths.sum())
    assert rows.cu_seq_lens.tolist() == [0, *lengths.cumsum(0).tolist()]
    assert torch.equal(rows.to_padded(rows.input_ids[0]), BATCH.batch["input_ids"] * BATCH.batch["attention_mask"])
    # positions restart at 0 for every sequence
    starts = rows.cu_seq_lens[:-1].long()
    assert torch.all(rows.position_ids[0, starts] == 0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_log_probs_and_entropy_match_padded(temperature):
    padded, packed = model_pair(Qwen2ForCausalLM)
    mask = BATCH.batch["response_mask"].bool()
    with torch.no_grad():
        lp, ent = response_log_probs_and_entropy(padded, BATCH, DEVICE, temperature, True)
        plp, pent = response_log_probs_and_entropy(packed, BATCH, DEVICE, temperature, True)
    assert plp.shape == lp.shape == (5, RESPONSE)
    torch.testing.assert_close(plp[mask], lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(pent[mask], ent[mask], atol=1e-5, rtol=0)
    assert torch.all(plp[~mask] == 0) and torch.all(pent[~mask] == 0)


def test_packed_gradients_match_padded():
    padded, packed = model_pair(Qwen2ForCausalLM, seed=1)
    mask = BATCH.batch["response_mask"].float()
    for model in (padded, packed):
        lp, ent = response_log_probs_and_entropy(model, BATCH, DEVICE, 1.0, True)
        ((lp + 0.1 * ent) * mask).sum().backward()
    for (name, a), (_, b) in zip(padded.named_parameters(), packed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_packed_values_and_reward_scores_match_padded():
    padded, packed = model_pair(Qwen2ForTokenClassification, seed=2)
    mask = BATCH.batch["response_mask"].bool()
    with torch.no_grad():
        values, packed_values = response_values(padded, BATCH, DEVICE), response_values(packed, BATCH, DEVICE)
    torch.testing.assert_close(packed_values[mask], values[mask], atol=1e-5, rtol=0)
    padded_rm, packed_rm = model_pair(Qwen2ForSequenceClassification, seed=3)
    with torch.no_grad():
        scores, packed_scores = response_scores(padded_rm, BATCH, DEVICE), response_scores(packed_rm, BATCH, DEVICE)
    torch.testing.assert_close(packed_scores[mask], scores[mask], atol=1e-5, rtol=0)


def test_generation_on_a_packed_model_is_unchanged():
    padded, packed = model_pair(Qwen2ForCausalLM, seed=4)
    prompts = BATCH.batch["input_ids"][:, :PROMPT]
    kwargs = dict(attention_mask=BATCH.batch["attention_mask"][:, :PROMPT], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(packed.generate(prompts, **kwargs), padded.generate(prompts, **kwargs))


def test_per_sequence_attention_never_crosses_sequences():
    q, k, v = (torch.randn(7, 2, 8) for _ in range(3))
    out = per_sequence_attention(q, k, v, [0, 3, 7], 0.5)
    v2 = v.clone()
    v2[:3] += 100.0  # changing the first sequence leaves the second one's output alone
    torch.testing.assert_close(per_sequence_attention(q, k, v2, [0, 3, 7], 0.5)[3:], out[3:])


def test_use_remove_padding_true_on_an_unsupported_model_names_the_key():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="use_remove_padding"):
        enable_packing(model, True)
    assert enable_packing(model, None) is False


def test_kernel_check_accepts_a_correct_kernel_and_rejects_broken_ones():
    from workers.packing.attention import _kernel_works

    def per_sequence(q, k, v, cu, max_len, scale, dropout):
        return per_sequence_attention(q, k, v, cu.tolist(), scale)

    def crossing(q, k, v, cu, max_len, scale, dropout):  # one causal attention over the whole packed row
        return per_sequence_attention(q, k, v, [0, q.shape[0]], scale)

    def failing(*args):
        raise RuntimeError("no kernel for this device")

    cpu = torch.device("cpu")
    with torch.no_grad():  # the first packed call may come from a no-grad pass
        assert _kernel_works(per_sequence, cpu, torch.float32)
    assert not _kernel_works(crossing, cpu, torch.float32)
    with pytest.warns(UserWarning, match="no kernel for this device"):
        assert not _kernel_works(failing, cpu, torch.float32)
