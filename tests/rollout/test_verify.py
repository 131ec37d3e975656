"""The sync checks themselves: a matching engine passes, a wrong one fails with a message saying what
differs and by how much; the probe batch is the same in every process."""

import math

import pytest
import torch
from torch import nn

from workers.rollout.verify import (
    MOE_ROUTING_OUTLIERS,
    SyncBound,
    WeightFingerprint,
    WeightSyncMismatch,
    compare_log_probs,
    probe_sequences,
    require_changed,
    require_match,
    trainer_log_probs,
)


def test_probe_is_fixed_and_within_the_vocabulary():
    first, second = probe_sequences(50), probe_sequences(50)
    assert first.equal(second) and first.shape == (4, 24)
    assert int(first.min()) >= 0 and int(first.max()) < 50


def test_matching_log_probs_pass_and_report_their_gap():
    trainer = torch.randn(4, 23)
    check = compare_log_probs(trainer, trainer + 5e-4, SyncBound.of(torch.float32), vocab_size=50)
    assert check.ok and check.max_abs_diff == pytest.approx(5e-4, rel=1e-3)
    require_match(check, "test")
    assert set(check.metrics()) == {
        "rollout/sync_logprob_max_diff", "rollout/sync_logprob_mean_diff", "rollout/sync_logprob_scaled_max_diff",
        "rollout/sync_tokens_over_bound",
    }


def test_a_wrong_engine_is_named_with_the_gap_and_the_tolerance():
    trainer = torch.randn(4, 23)
    engine = trainer.clone()
    engine[2, 7] += 1.5  # one mis-loaded weight shows up as a large gap somewhere
    check = compare_log_probs(trainer, engine, SyncBound(1e-3), vocab_size=50)
    assert not check.ok
    with pytest.raises(WeightSyncMismatch, match=r"in-process weight sync: .* differ from the trainer's by up to 1.5 .*tolerance 0.001"):
        require_match(check, "in-process weight sync")
    with pytest.raises(WeightSyncMismatch, match="shapes differ"):
        compare_log_probs(trainer, engine[:, :5], SyncBound(1e-3), vocab_size=50)


def test_the_bound_grows_with_how_far_a_token_lies_below_the_uniform_log_prob():
    uniform = math.log(100)
    trainer = torch.full((2, 4), -uniform)
    trainer[1, 2] = -4 * uniform  # a tail token of a sharpened policy: four times the uniform's distance
    engine = trainer.clone()
    engine[1, 2] += 0.9  # within 0.25 x 4
    check = compare_log_probs(trainer, engine, SyncBound(0.25), vocab_size=100)
    assert check.ok and check.max_abs_diff == pytest.approx(0.9) and check.scaled_max_diff == pytest.approx(0.225)
    engine[0, 1] += 0.3  # at the uniform log-prob the bound is the tolerance itself
    check = compare_log_probs(trainer, engine, SyncBound(0.25), vocab_size=100)
    assert not check.ok and check.worst_diff == pytest.approx(0.3) and check.max_abs_diff == pytest.approx(0.9)
    with pytest.raises(WeightSyncMismatch, match=r"1 of 8 tokens exceed their bound; .* log-prob -4.61, differs by 0.3, above its bound 0.25"):
        require_match(check, "sync")
    likelier = torch.full((2, 4), -0.1)  # a likely token never gets a bound below the tolerance
    assert not compare_log_probs(likelier, likelier + 0.3, SyncBound(0.25), vocab_size=100).ok
    broken = likelier.clone()
    broken[0, 0] = float("nan")  # an engine that computes NaN fails, even where routing outliers are allowed
    check = compare_log_probs(likelier, broken, SyncBound(0.25, outlier_fraction=0.5), vocab_size=100)
    assert not check.ok and check.over_bound == 1 and check.allowed_over_bound == 4
    with pytest.raises(WeightSyncMismatch, match="1 of 8 tokens exceed their bound .NaN or infinite"):
        require_match(check, "sync")


def test_a_mixture_of_experts_in_half_precision_may_route_a_few_tokens_otherwise():
    dense, moe = SyncBound.of(torch.bfloat16), SyncBound.of(torch.bfloat16, experts=True)
    assert dense.outlier_fraction == 0 and moe.outlier_fraction == MOE_ROUTING_OUTLIERS
    assert SyncBound.of(torch.float32, experts=True) == SyncBound.of(torch.float32)  # fp32 routes alike
    assert SyncBound.of(torch.bfloat16, experts=True, tolerance=0.5).tolerance == 0.5  # the user's bound kept
    trainer = torch.full((4, 23), -math.log(100))
    engine = trainer.clone()
    engine.view(-1)[:4] += 3.0  # four near-tie tokens went to another expert: 4 <= 5% of 92
    assert compare_log_probs(trainer, engine, moe, vocab_size=100).ok
    assert not compare_log_probs(trainer, engine, dense, vocab_size=100).ok
    engine.view(-1)[:5] += 3.0  # a fifth: more than routing ties explain
    check = compare_log_probs(trainer, engine, moe, vocab_size=100)
    assert not check.ok and check.over_bound == 5 and check.allowed_over_bound == 4
    with pytest.raises(WeightSyncMismatch, match=r"5 of 92 tokens exceed their bound \(at most 4 may: routing"):
        require_match(check, "sync")


def test_the_engine_changes_exactly_when_the_trainer_does():
    require_changed(1.0, 2.0, 5.0, 6.0, where="sync")  # both changed
    require_changed(1.0, 1.0, 5.0, 5.0, where="sync")  # neither: a zero-gradient step is fine
    with pytest.raises(WeightSyncMismatch, match="the sync loaded nothing"):
        require_changed(3.0, 3.0, 5.0, 6.0, where="sync")
    with pytest.raises(WeightSyncMismatch, match="loaded something other"):
        require_changed(3.0, 4.0, 5.0, 5.0, where="sync")


def test_a_fingerprint_sees_only_changes_that_survive_the_engines_dtype():
    weights = torch.randn(64, 64).bfloat16().float()  # the engine's values, held in fp32 by the trainer
    def fingerprint(tensor):
        taken = WeightFingerprint()
        taken.add([tensor.to(torch.bfloat16)])
        return taken.value

    assert fingerprint(weights) == fingerprint(weights.clone())
    assert fingerprint(weights) == fingerprint(weights * (1 + 1e-5))  # below bf16 resolution: unchanged
    nudged = weights.clone()
    nudged[3, 5] *= 1.05
    assert fingerprint(weights) != fingerprint(nudged)  # one element moved by more than a bf16 ulp


def _largest_allocation(tensor: torch.Tensor, chunk_elements: int) -> tuple[float, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        taken = WeightFingerprint(chunk_elements)
        taken.add([tensor])
        value = taken.value
    return value, max(event.cpu_memory_usage for event in prof.events())


def test_a_fingerprint_sums_a_chunk_at_a_time_with_the_same_value():
    """A float64 sum casts its input first: over a whole large tensor that was 4x its bf16 bytes of temporaries
    (5.4 GiB for a 7B embedding on a GPU whose engine was awake); a chunk at a time it is a chunk's."""
    weights = torch.randn(1 << 20).bfloat16()
    whole_value, whole_peak = _largest_allocation(weights, weights.numel())
    chunked_value, chunked_peak = _largest_allocation(weights, 1 << 14)
    assert whole_value == pytest.approx(torch.sum(weights.abs(), dtype=torch.float64).item(), rel=1e-12)
    assert chunked_value == pytest.approx(whole_value, rel=1e-12)
    assert whole_peak >= 8 * weights.numel()  # the float64 copy of the whole tensor
    assert chunked_peak <= 8 * (1 << 14)
    noncontiguous = torch.randn(64, 96).bfloat16().t()
    assert _largest_allocation(noncontiguous, 100)[0] == pytest.approx(
        torch.sum(noncontiguous.abs(), dtype=torch.float64).item(), rel=1e-12
    )


class _LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(30, 8), nn.Linear(8, 30)

    def forward(self, input_ids, use_cache=False):
        return type("Out", (), {"logits": self.head(self.embed(input_ids))})()


def test_trainer_log_probs_score_the_next_token_and_restore_the_mode():
    model = _LM().train()
    ids = probe_sequences(30)
    log_probs = trainer_log_probs(model, ids, torch.device("cpu"))
    assert model.training and log_probs.shape == (4, 23)
    expected = torch.log_softmax(model.head(model.embed(ids)), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(log_probs, expected.detach())
