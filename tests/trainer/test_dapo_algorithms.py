"""DAPO's pieces as pure functions: group filtering over several generation batches, the overlong penalty,
GSPO's sequence-ratio loss against a direct computation, and Dr. GRPO's advantage and aggregation."""

import numpy as np
import pytest
import torch

from protocol import DataProto
from trainer.algorithms import compute_grpo_outcome_advantage
from trainer.dynamic_sampling import ScoredRollout, fill_with_mixed_groups, metric_values, rows_per_prompt, split_groups
from trainer.rewards.overlong import add_overlong_penalty, overlong_penalty
from trainer.rollout_pipeline import prompts_for_step
from workers.rl_math.losses import LOSS_AGG_MODES as LOSS_CODE_MODES
from workers.rl_math.losses import agg_loss, compute_policy_loss
from workers.rl_math.names import LOSS_AGG_MODES

# ---------------------------------------------------------------- group filtering


def test_split_groups_keeps_groups_whose_values_differ():
    uids = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    values = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5])
    mixed, uniform = split_groups(values, uids)
    assert [rows.tolist() for rows in mixed] == [[0, 1], [6]]  # a group of one response is kept, as in verl
    assert [rows.tolist() for rows in uniform] == [[2, 3], [4, 5]]


def _scored_batch(draw: int, group_scores: list[list[float]], n: int = 2) -> ScoredRollout:
    """A generated batch of `len(group_scores)` prompts x n responses, scored as given (rule score on the last token)."""
    prompts = DataProto.from_dict({"prompt_id": torch.arange(len(group_scores))})
    rollout = prompts_for_step(prompts, step=3, n=n, seed=0, draw=draw)
    rule = np.array([s for group in group_scores for s in group], dtype=np.float32)
    scores = torch.zeros(len(rule), 4)
    scores[:, -1] = torch.as_tensor(rule)
    rollout.batch["token_level_scores"] = scores - 0.25  # e.g. an overlong penalty: not part of acc/score
    return ScoredRollout(rollout, rule, {"char_class/mean": float(rule.mean())}, reward_fn_s=0.5)


def test_draws_batches_until_enough_mixed_groups_then_trims_to_the_batch_size():
    first = _scored_batch(0, [[1, 1], [0, 1], [0, 0], [1, 1]])  # one mixed group of four
    extra = [_scored_batch(1, [[1, 0], [1, 1], [0, 1], [0, 0]]), _scored_batch(2, [[0, 1], [1, 0], [0, 1], [1, 0]])]
    drawn = iter(extra)
    scored, counts = fill_with_mixed_groups(first, lambda: next(drawn), target=4, metric="acc", max_batches=10)
    uids = scored.rollout.non_tensor_batch["uid"].tolist()
    assert uids == ["3-0-1", "3-0-1", "3-1-0", "3-1-0", "3-1-2", "3-1-2", "3-2-0", "3-2-0"]  # unique per draw, in order
    assert counts == {
        "filter_groups/gen_batches": 3, "filter_groups/mixed_groups": 7, "filter_groups/uniform_groups": 5,
        "filter_groups/trimmed_groups": 3, "filter_groups/topped_up_groups": 0,
    }
    assert scored.rule_scores.tolist() == [0, 1, 1, 0, 0, 1, 0, 1]  # the kept rows' own scores
    for rows in split_groups(scored.rule_scores, scored.rollout.non_tensor_batch["uid"])[0]:
        assert len(rows) == 2  # every kept group is mixed and whole
    assert scored.reward_fn_s == 1.5 and scored.metrics["generated_score_mean"] == pytest.approx(13 / 24)
    assert scored.rollout.meta_info["seed"] == first.rollout.meta_info["seed"]  # per-draw seeds concatenate


def test_hitting_the_batch_cap_fills_up_with_uniform_groups():
    first = _scored_batch(0, [[1, 1], [0, 1], [0, 0]])
    drawn = iter([_scored_batch(1, [[1, 1], [0, 0], [1, 0]])])
    scored, counts = fill_with_mixed_groups(first, lambda: next(drawn), target=3, metric="score", max_batches=2)
    assert counts["filter_groups/gen_batches"] == 2 and counts["filter_groups/topped_up_groups"] == 1
    # The two mixed groups first, then the first uniform group generated.
    assert scored.rollout.non_tensor_batch["uid"].tolist() == ["3-0-1"] * 2 + ["3-1-2"] * 2 + ["3-0-0"] * 2


def test_metrics_read_the_rule_score_or_the_summed_token_scores():
    scored = _scored_batch(0, [[1, 0.5]])
    assert metric_values(scored, "acc").tolist() == [1.0, 0.5] and metric_values(scored, "score").tolist() == [1.0, 0.5]
    assert metric_values(scored, "seq_reward").tolist() == pytest.approx([1 - 1.0, 0.5 - 1.0])  # 4 tokens x -0.25
    assert metric_values(scored, "seq_final_reward").tolist() == metric_values(scored, "seq_reward").tolist()
    with pytest.raises(ValueError, match=r"choose one of \['acc', 'score', 'seq_reward', 'seq_final_reward'\]"):
        metric_values(scored, "accuracy")


def test_rows_per_prompt_undoes_the_repeat():
    prompts = prompts_for_step(DataProto.from_dict({"prompt_id": torch.arange(3)}), step=0, n=4, seed=0)
    assert rows_per_prompt(prompts, 4).batch["prompt_id"].tolist() == [0, 1, 2]


# ---------------------------------------------------------------- overlong penalty


def test_overlong_penalty_is_linear_over_the_buffer():
    lengths = torch.tensor([0, 5, 9, 10, 11, 12])
    penalty = overlong_penalty(lengths, max_response_length=12, buffer_len=3, penalty_factor=0.6)
    assert penalty.tolist() == pytest.approx([0, 0, 0, -0.2, -0.4, -0.6])
    with pytest.raises(ValueError, match=r"must be in 1\.\.11"):
        overlong_penalty(lengths, 12, 12, 1.0)


def test_overlong_penalty_lands_on_the_last_response_token():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]])  # the last row has a tool-token hole
    scores = torch.zeros(4, 4)
    scores[0, 3], scores[1, 1] = 1.0, 0.5
    penalised, metrics = add_overlong_penalty(scores, mask, max_response_length=4, buffer_len=2, penalty_factor=1.0)
    assert penalised.tolist() == [[0, 0, 0, 0.0], [0, 0.5, 0, 0], [0, 0, 0, 0], [0, 0, 0, -0.5]]
    assert metrics == {"overlong_penalty_mean": pytest.approx(-1.5 / 4), "overlong_fraction": 0.5}
    assert scores[0, 3] == 1.0  # the input is left as it was


# ---------------------------------------------------------------- GSPO


def _gspo_inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    old = -torch.rand(3, 5, generator=generator) * 2
    new = (old + torch.randn(3, 5, generator=generator) * 0.3).requires_grad_()
    advantages = torch.tensor([1.0, -0.5, 2.0])[:, None].expand(3, 5) * mask  # one advantage per response (GRPO)
    return old, new, advantages, mask


def _direct_gspo(old, new, advantages, mask, low, high):
    """GSPO's sequence objective as written: s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|), mean over responses."""
    lengths = mask.sum(-1)
    s = torch.exp(((new - old) * mask).sum(-1) / lengths)
    a = advantages[:, 0]
    return torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high)).mean(), s


@pytest.mark.parametrize("low, high", [(0.2, 0.28), (0.02, 0.02)])  # the second clips some sequences
def test_gspo_loss_and_gradient_match_the_sequence_objective(low, high):
    old, new, advantages, mask = _gspo_inputs()
    loss = compute_policy_loss(old, new, advantages, mask, low, high, loss_agg_mode="seq-mean-token-mean", loss_mode="gspo")
    (grad,) = torch.autograd.grad(loss["pg_loss"], new)
    direct, s = _direct_gspo(old, new, advantages, mask, low, high)
    (direct_grad,) = torch.autograd.grad(direct, new)
    assert loss["pg_loss"].item() == pytest.approx(direct.item(), rel=1e-6)
    assert torch.allclose(grad, direct_grad, atol=1e-7)
    clipped = ((s < 1 - low) & (advantages[:, 0] < 0)) | ((s > 1 + high) & (advantages[:, 0] > 0))
    assert loss["pg_clipfrac"].item() == pytest.approx(float((clipped[:, None] * mask).sum() / mask.sum()))
    assert loss["pg_clipfrac_lower"].item() == 0.0
    if low == 0.02:
        assert clipped.any() and (grad[clipped] == 0).all() and (grad[~clipped][mask[~clipped] == 1] != 0).all()


def test_gspo_differs_from_the_token_ratio_and_each_token_gets_the_sequence_gradient():
    old, new, advantages, mask = _gspo_inputs(1)
    gspo = compute_policy_loss(old, new, advantages, mask, 10.0, 10.0, clip_ratio_c=1.01, loss_mode="gspo")
    (grad,) = torch.autograd.grad(gspo["pg_loss"], new)
    s = torch.exp(((new - old) * mask).sum(-1) / mask.sum(-1)).detach()
    # token-mean: d/d log pi(y_t) = -A_i * s_i / (all tokens), the same for every token of a response
    assert torch.allclose(grad, -advantages * s[:, None] / mask.sum(), atol=1e-7)
    assert gspo["pg_clipfrac_lower"].item() == 0.0  # no dual clip, even with a bound of 1.01
    vanilla = compute_policy_loss(old, new, advantages, mask, 10.0, 10.0, clip_ratio_c=1.01)
    assert abs(vanilla["pg_loss"].item() - gspo["pg_loss"].item()) > 1e-3 and vanilla["pg_clipfrac_lower"].item() > 0


def test_an_unknown_policy_loss_is_named_with_the_valid_ones():
    old, new, advantages, mask = _gspo_inputs()
    with pytest.raises(ValueError, match=r"unknown policy loss_mode 'gpg'; valid: \['vanilla', 'gspo', 'geo_mean'\]"):
        compute_policy_loss(old, new, advantages, mask, loss_mode="gpg")


# ---------------------------------------------------------------- Dr. GRPO and the aggregation modes


def test_dr_grpo_centres_without_std_and_sums_tokens_over_a_constant():
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    rewards = torch.zeros(4, 6)
    for row, (score, last) in enumerate([(1.0, 3), (0.0, 1), (0.5, 5), (0.5, 0)]):
        rewards[row, last] = score
    advantages, _ = compute_grpo_outcome_advantage(rewards, mask, np.array(["a", "a", "b", "b"]), norm_adv_by_std=False)
    assert advantages[:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]  # score minus the group mean, no division by the std
    assert torch.equal(advantages, advantages[:, :1] * mask)
    # With ratio 1 the policy loss is -A per token; seq-mean-token-sum-norm sums each response's tokens and
    # divides by the response width (the max response length), then averages over responses.
    old = torch.zeros(4, 6)
    loss = compute_policy_loss(old, old.clone(), advantages, mask, loss_agg_mode="seq-mean-token-sum-norm")["pg_loss"]
    expected = -(0.5 * 4 - 0.5 * 2) / 6 / 4
    assert loss.item() == pytest.approx(expected)
    # A longer response weighs more (no 1/|o| length normalisation), unlike seq-mean-token-mean.
    per_token = torch.ones(2, 6)
    short_long = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert agg_loss(per_token, short_long, "seq-mean-token-sum-norm").item() == pytest.approx((1 / 6 + 6 / 6) / 2)
    assert agg_loss(per_token, short_long, "seq-mean-token-mean").item() == pytest.approx(1.0)


def test_every_aggregation_mode_of_the_loss_code_is_the_configs():
    assert LOSS_CODE_MODES is LOSS_AGG_MODES and "seq-mean-token-sum-norm" in LOSS_AGG_MODES
    for mode in LOSS_AGG_MODES:
        assert torch.isfinite(agg_loss(torch.ones(2, 3), torch.ones(2, 3), mode))
