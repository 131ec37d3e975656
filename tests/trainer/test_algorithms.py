"""Tests for trainer.algorithms against small, hand-computed examples."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch

from trainer.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
    get_advantage_estimator,
    make_kl_controller,
)
from workers.rl_math.kl import kl_penalty
from workers.rl_math.logits import entropy_from_logits, log_probs_from_logits
from workers.rl_math.losses import agg_loss, compute_policy_loss, compute_value_loss
from workers.rl_math.masked import masked_mean, masked_sum, masked_var, masked_whiten

NAN = float("nan")
T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, T(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


def whiten_list(xs: list[float]) -> list[float]:
    """Reference whitening of the real-token values (unbiased std)."""
    mu, sd = statistics.mean(xs), statistics.stdev(xs)
    return [(x - mu) / sd for x in xs]


# --------------------------------------------------------------------------- masked ops

# Row 0 fully real; row 1 has one real token and junk (incl. nan) in the padding.
X = T([[1.0, 2.0, 3.0], [4.0, 100.0, NAN]])
M = T([[1, 1, 1], [1, 0, 0]])


def test_masked_sum_and_mean():
    # real tokens: 1, 2, 3, 4
    close(masked_sum(X, M), 10.0)
    close(masked_mean(X, M), 10.0 / 4)
    close(masked_sum(X, M, dim=-1), [6.0, 4.0])
    close(masked_mean(X, M, dim=-1), [6.0 / 3, 4.0 / 1])
    close(masked_mean(X, M.bool(), dim=0), [(1 + 4) / 2, 2.0, 3.0])


def test_masked_mean_empty_mask_is_zero_with_finite_grad():
    x = T([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    m = T([[1, 1], [0, 0]])
    out = masked_mean(x, m, dim=-1)
    close(out.detach(), [1.5, 0.0])
    out.sum().backward()
    close(x.grad, [[0.5, 0.5], [0.0, 0.0]])


def test_masked_var():
    # mean 2.5; squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5
    close(masked_var(X, M, unbiased=False), 5.0 / 4)
    close(masked_var(X, M, unbiased=True), 5.0 / 3)
    # one real value: Bessel undefined -> 0, not inf/nan
    close(masked_var(T([[7.0, 1.0]]), T([[1, 0]])), 0.0)


def test_masked_whiten():
    sd = math.sqrt(5.0 / 3)
    expected = [(v - 2.5) / sd for v in (1.0, 2.0, 3.0, 4.0)]
    real = M.bool()
    close(masked_whiten(X, M)[real], expected)
    close(masked_whiten(X, M, shift_mean=False)[real], [e + 2.5 for e in expected])


# --------------------------------------------------------------------------- GAE


def test_gae_hand_computed_and_padding_ignored():
    gamma, lam = 0.5, 0.5  # gamma * lam = 0.25
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0]])  # 7.0 is in padding
    values = T([[0.5, 0.5, 0.5], [1.0, 0.5, 100.0]])  # 100.0 is in padding
    mask = T([[1, 1, 1], [1, 1, 0]])
    # row 0: t2 delta = 1 + 0.5*0 - 0.5 = 0.5                  A2 = 0.5
    #        t1 delta = 0 + 0.5*0.5 - 0.5 = -0.25              A1 = -0.25 + 0.25*0.5 = -0.125
    #        t0 delta = -0.25                                  A0 = -0.25 + 0.25*-0.125 = -0.28125
    # row 1: t2 padding: skipped, so t1 bootstraps from terminal V = 0 (not 100)
    #        t1 delta = 2 + 0 - 0.5 = 1.5                      A1 = 1.5
    #        t0 delta = 0 + 0.5*0.5 - 1.0 = -0.75              A0 = -0.75 + 0.25*1.5 = -0.375
    adv, ret = compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    # returns = A + V on real tokens, 0 on padding
    close(ret, [[-0.28125 + 0.5, -0.125 + 0.5, 0.5 + 0.5], [-0.375 + 1.0, 1.5 + 0.5, 0.0]])
    w = whiten_list([-0.28125, -0.125, 0.5, -0.375, 1.5])
    close(adv, [[w[0], w[1], w[2]], [w[3], w[4], 0.0]], atol=1e-5)


def test_gae_interior_hole_is_skipped():
    # A masked token in the middle (e.g. tool output) must be transparent:
    # [v0, junk, v2] with mask [1, 0, 1] equals the compact [v0, v2].
    gamma, lam = 0.9, 0.8
    _, ret_hole = compute_gae_advantage_return(
        T([[0.3, 50.0, 1.0]]), T([[0.2, NAN, 0.7]]), T([[1, 0, 1]]), gamma, lam
    )
    _, ret_compact = compute_gae_advantage_return(T([[0.3, 1.0]]), T([[0.2, 0.7]]), T([[1, 1]]), gamma, lam)
    close(ret_hole[:, [0, 2]], ret_compact.tolist())
    # hand: A1 = 1.0 - 0.7 = 0.3; A0 = (0.3 + 0.9*0.7 - 0.2) + 0.72*0.3 = 0.946
    close(ret_compact, [[0.946 + 0.2, 0.3 + 0.7]])


# --------------------------------------------------------------------------- outcome estimators

# scores (sum of real-token rewards): 1, 0, 2 | 3, 1  (row 1's 5.0 is padding)
OUT_REWARDS = T(
    [[0.0, 0.0, 1.0], [0.0, 0.0, 5.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]]
)
OUT_MASK = T([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]])
GROUPS = np.array(["a", "a", "a", "b", "b"], dtype=object)


def broadcast(per_row: list[float], mask: torch.Tensor) -> list[list[float]]:
    return [[v * float(m) for m in row] for v, row in zip(per_row, mask.tolist())]


def test_grpo_two_groups_with_std_norm():
    eps = 1e-6
    # group a: scores 1, 0, 2 -> mean 1, unbiased std sqrt((0 + 1 + 1) / 2) = 1
    # group b: scores 3, 1    -> mean 2, unbiased std sqrt((1 + 1) / 1) = sqrt(2)
    per_row = [0 / (1 + eps), -1 / (1 + eps), 1 / (1 + eps), 1 / (2**0.5 + eps), -1 / (2**0.5 + eps)]
    adv, ret = compute_grpo_outcome_advantage(OUT_REWARDS, OUT_MASK, GROUPS, epsilon=eps)
    close(adv, broadcast(per_row, OUT_MASK))
    close(ret, adv.tolist())


def test_grpo_two_groups_without_std_norm_and_int_ids():
    # only the group mean is subtracted: 1-1, 0-1, 2-1 | 3-2, 1-2
    int_ids = np.array([7, 7, 7, 9, 9])
    adv, _ = compute_grpo_outcome_advantage(OUT_REWARDS, OUT_MASK, int_ids, norm_adv_by_std=False)
    close(adv, broadcast([0.0, -1.0, 1.0, 1.0, -1.0], OUT_MASK))


def test_grpo_singleton_group_uses_mean0_std1():
    eps = 1e-6
    r, m = T([[0.0, 3.0]]), T([[1, 1]])
    adv, _ = compute_grpo_outcome_advantage(r, m, np.array(["solo"]), epsilon=eps)
    close(adv, [[3.0 / (1 + eps)] * 2])
    adv, _ = compute_grpo_outcome_advantage(r, m, np.array(["solo"]), norm_adv_by_std=False)
    close(adv, [[3.0, 3.0]])


def test_grpo_rejects_wrong_group_length():
    with pytest.raises(ValueError, match="group_index has 2 entries"):
        compute_grpo_outcome_advantage(OUT_REWARDS, OUT_MASK, np.array(["a", "b"]))


def test_rloo_leave_one_out_and_singleton():
    # group a (1, 0, 2): 1 - (0+2)/2 = 0 ; 0 - (1+2)/2 = -1.5 ; 2 - (1+0)/2 = 1.5
    # group b (3, 1):    3 - 1 = 2      ; 1 - 3 = -2
    adv, ret = compute_rloo_outcome_advantage(OUT_REWARDS, OUT_MASK, GROUPS)
    close(adv, broadcast([0.0, -1.5, 1.5, 2.0, -2.0], OUT_MASK))
    close(ret, adv.tolist())
    # a group of size 1 has no leave-one-out baseline -> advantage 0
    adv, _ = compute_rloo_outcome_advantage(T([[4.0, 1.0]]), T([[1, 1]]), ["solo"])
    close(adv, [[0.0, 0.0]])


def test_reinforce_plus_plus_discounting_gamma_half():
    rewards = T([[1.0, 0.0, 2.0], [0.0, 4.0, 9.0]])  # 9.0 is padding
    mask = T([[1, 1, 1], [1, 1, 0]])
    # row 0: G2 = 2 ; G1 = 0 + 0.5*2 = 1 ; G0 = 1 + 0.5*1 = 1.5
    # row 1: G1 = 4 (padding reward never enters) ; G0 = 0 + 0.5*4 = 2
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    close(ret, [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]])
    w = whiten_list([1.5, 1.0, 2.0, 2.0, 4.0])
    close(adv, [[w[0], w[1], w[2]], [w[3], w[4], 0.0]], atol=1e-5)


def test_reinforce_plus_plus_baseline():
    rewards = T([[1.0, 0.0], [0.0, 0.0], [2.0, 3.0]])  # row 2's 3.0 is padding
    mask = T([[1, 1], [1, 1], [1, 0]])
    groups = np.array(["a", "a", "b"], dtype=object)
    # scores 1, 0 | 2 ; group a mean 0.5 -> 0.5, -0.5 ; b is a singleton (mean 0) -> 2
    # token values [.5, .5, -.5, -.5, 2]: mean 0.4, sq. deviations
    # .01 + .01 + .81 + .81 + 2.56 = 4.2 -> unbiased var 4.2 / 4 = 1.05
    eps = 1e-6
    sd = math.sqrt(1.05 + eps)
    a, b, c = (0.5 - 0.4) / sd, (-0.5 - 0.4) / sd, (2.0 - 0.4) / sd
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, groups, epsilon=eps)
    close(adv, [[a, a], [b, b], [c, 0.0]])
    close(ret, adv.tolist())


def test_remax():
    rewards = T([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])  # 9.0 is padding
    mask = T([[1, 1, 1], [1, 1, 0]])
    baselines = T([0.5, 3.0])
    # return-to-go: row 0 [1, 1, 1], row 1 [2, 2, 0]; minus greedy baseline per row
    adv, ret = compute_remax_outcome_advantage(rewards, baselines, mask)
    close(ret, [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])
    close(adv, [[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]])


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_padding_content_never_matters(name):
    torch.manual_seed(0)
    mask = T([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]])
    rewards, values = torch.randn(4, 4), torch.randn(4, 4)
    junk_r, junk_v = rewards.clone(), values.clone()
    junk_r[mask == 0], junk_v[mask == 0] = 1e6, NAN
    groups = np.array([0, 0, 1, 1])
    fn = get_advantage_estimator(name)

    def run(r, v):
        if name == "gae":
            return fn(r, v, mask, gamma=0.9, lam=0.95)
        if name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
            return fn(r, mask, groups)
        if name == "reinforce_plus_plus":
            return fn(r, mask, gamma=0.9)
        return fn(r, T([0.1, 0.2, 0.3, 0.4]), mask)

    for clean, dirty in zip(run(rewards, values), run(junk_r, junk_v)):
        torch.testing.assert_close(clean, dirty)
        assert torch.all(dirty[mask == 0] == 0)


def test_advantage_registry():
    assert set(ADVANTAGE_ESTIMATORS) == {
        "gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax"
    }
    assert get_advantage_estimator("grpo") is compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match=r"Unknown advantage estimator 'ppo'.*valid names.*'gae'"):
        get_advantage_estimator("ppo")


# --------------------------------------------------------------------------- policy loss


def _policy_case():
    # token: A,   ratio
    #   a:  +1,   1   -> -1                      (no clip)
    #   b:  +1,   2   -> max(-2, -1.2) = -1.2    (clip binds)
    #   c:  -1,   0.5 -> max(0.5, 0.8) = 0.8     (clip binds), dual bound 3 not active
    #   d:  -1,   5   -> max(5, 1.2) = 5 -> min(5, 3) = 3   (dual clip binds)
    #   e:  +2,   1   -> -2
    #   f:  padding with A=100, ratio e^10 (ignored)
    old = torch.full((2, 3), -1.0)
    ratios = T([[1.0, 2.0, 0.5], [5.0, 1.0, math.exp(10.0)]])
    new = (old + ratios.log()).requires_grad_(True)
    adv = T([[1.0, 1.0, -1.0], [-1.0, 2.0, 100.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    return old, new, adv, mask


def test_policy_loss_dual_clip_hand_computed():
    old, new, adv, mask = _policy_case()
    out = compute_policy_loss(old, new, adv, mask, 0.2, 0.2, 3.0, "token-mean")
    close(out["pg_loss"].detach(), (-1 - 1.2 + 0.8 + 3 - 2) / 5)  # = -0.08
    close(out["pg_clipfrac"], 2 / 5)  # b, c
    close(out["pg_clipfrac_lower"], 1 / 5)  # d
    # ppo_kl = mean(old - new) = -(0 + ln2 + ln0.5 + ln5 + 0) / 5
    close(out["ppo_kl"], -math.log(5.0) / 5)
    out["pg_loss"].backward()
    # d(-A r)/d logp = -A r; only unclipped tokens a (-1) and e (-2) carry gradient
    close(new.grad, [[-1 / 5, 0.0, 0.0], [0.0, -2 / 5, 0.0]])


def test_policy_loss_asymmetric_clip_and_seq_mean():
    old, new, adv, mask = _policy_case()
    out = compute_policy_loss(old, new, adv, mask, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean")
    # b now clips at 1.28 -> -1.28 ; row means: (-1 - 1.28 + 0.8)/3 and (3 - 2)/2
    close(out["pg_loss"].detach(), ((-1 - 1.28 + 0.8) / 3 + 0.5) / 2)


def test_policy_loss_rejects_bad_clip_ratio_c():
    old, new, adv, mask = _policy_case()
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1.0"):
        compute_policy_loss(old, new, adv, mask, clip_ratio_c=1.0)


# --------------------------------------------------------------------------- aggregation


def test_agg_loss_modes_on_ragged_mask():
    loss = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = T([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # lengths 3, 1 and an empty row
    close(agg_loss(loss, mask, "token-mean"), (1 + 2 + 3 + 4) / 4)
    close(agg_loss(loss, mask, "seq-mean-token-sum"), (6 + 4) / 2)
    close(agg_loss(loss, mask, "seq-mean-token-mean"), (6 / 3 + 4 / 1) / 2)
    close(agg_loss(loss, mask, "seq-mean-token-sum-norm"), (6 / 3 + 4 / 3) / 2)
    with pytest.raises(ValueError, match=r"Unknown loss_agg_mode 'mean'.*valid modes.*'token-mean'"):
        agg_loss(loss, mask, "mean")


# --------------------------------------------------------------------------- value loss


def test_value_loss_clipped():
    # t1: v=1.0 old=0.5 R=1 -> v_clip 0.7: errors 0, 0.09 -> 0.09 (clipped branch larger)
    # t2: v=0.6 old=0.5 R=0 -> v_clip 0.6: errors .36, .36 -> .36
    # t3: v=0.0 old=0.5 R=1 -> v_clip 0.3: errors 1, .49 -> 1
    # t4: padding
    vpreds = T([[1.0, 0.6], [0.0, 10.0]])
    old = T([[0.5, 0.5], [0.5, 0.0]])
    ret = T([[1.0, 0.0], [1.0, -10.0]])
    mask = T([[1, 1], [1, 0]])
    vf_loss, clipfrac = compute_value_loss(vpreds, old, ret, mask, 0.2, "token-mean")
    close(vf_loss, 0.5 * (0.09 + 0.36 + 1.0) / 3)
    close(clipfrac, 1 / 3)
    vf_loss, _ = compute_value_loss(vpreds, old, ret, mask, 0.2, "seq-mean-token-sum")
    close(vf_loss, 0.5 * ((0.09 + 0.36) + 1.0) / 2)


# --------------------------------------------------------------------------- logits helpers


def test_entropy_from_logits():
    logits = T([[0.0, 0.0], [0.0, math.log(3.0)], [1000.0, 1000.0], [0.0, -math.inf]])
    # uniform over 2: ln 2 ; probs (1/4, 3/4): -(1/4 ln 1/4 + 3/4 ln 3/4) ;
    # huge equal logits: ln 2 ; one-hot (other token -inf): 0
    h13 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(entropy_from_logits(logits), [math.log(2), h13, math.log(2), 0.0])
    bf = entropy_from_logits(T([[0.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16))
    assert bf.dtype == torch.float32
    close(bf, [math.log(4)])


def test_entropy_gradient_finite_with_banned_token():
    z = T([[0.0, -math.inf, 0.0]], requires_grad=True)
    entropy_from_logits(z).sum().backward()
    # uniform over the two allowed tokens is the entropy maximum: zero gradient, no nan
    close(z.grad, [[0.0, 0.0, 0.0]])


def test_log_probs_from_logits():
    logits = T([[0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    # softmax = (1/4, 3/4)
    close(log_probs_from_logits(logits, T([1, 0])), [math.log(0.75), math.log(0.25)])
    torch.manual_seed(0)
    z, y = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    ref = torch.log_softmax(z, -1).gather(-1, y[..., None])[..., 0]
    torch.testing.assert_close(log_probs_from_logits(z, y), ref)
    # half-precision path, with chunks smaller than the number of rows
    got = log_probs_from_logits(z.bfloat16(), y, chunk_size=3)
    assert got.shape == (2, 5) and got.dtype == torch.float32
    ref_bf = torch.log_softmax(z.bfloat16().float(), -1).gather(-1, y[..., None])[..., 0]
    torch.testing.assert_close(got, ref_bf)


# --------------------------------------------------------------------------- KL


def test_kl_penalty_estimators():
    logp, ref = T([0.0, -1.0]), T([-1.0, 0.0])  # d = logp - ref = [1, -1]
    close(kl_penalty(logp, ref, "kl"), [1.0, -1.0])
    close(kl_penalty(logp, ref, "k1"), [1.0, -1.0])
    close(kl_penalty(logp, ref, "abs"), [1.0, 1.0])
    close(kl_penalty(logp, ref, "k2"), [0.5, 0.5])  # 0.5 * d^2
    close(kl_penalty(logp, ref, "mse"), [0.5, 0.5])
    # k3 = exp(ref - logp) - (ref - logp) - 1: d=1 -> e^-1 + 1 - 1 ; d=-1 -> e - 1 - 1
    close(kl_penalty(logp, ref, "k3"), [math.exp(-1.0), math.e - 2.0])
    close(kl_penalty(logp, ref, "low_var_kl"), [math.exp(-1.0), math.e - 2.0])
    # ref - logp = 20 -> e^20 - 21 clamps to 10
    close(kl_penalty(T([-20.0]), T([0.0]), "k3"), [10.0])
    with pytest.raises(ValueError, match=r"Unknown kl_penalty 'k4'.*valid names.*'low_var_kl'"):
        kl_penalty(logp, ref, "k4")


def test_apply_kl_penalty_fixed_and_adaptive():
    scores = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    ref = torch.zeros(2, 3)
    logp = T([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])  # k1 = logp; 9.0 is padding
    mask = T([[1, 1, 1], [1, 1, 0]])
    ctrl = FixedKLController(0.5)
    rewards, metrics = apply_kl_penalty(scores, logp, ref, mask, ctrl, "kl")
    # rewards = scores - 0.5 * kl on real tokens
    close(rewards, [[-0.05, -0.1, 1.0 - 0.15], [-0.2, 2.0 - 0.25, 0.0]])
    # per-seq mean KL: 0.2 and 0.45 -> batch 0.325
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.325)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    assert ctrl.value == 0.5

    ada = AdaptiveKLController(init_kl_coef=0.5, target_kl=0.25, horizon=10)
    _, metrics = apply_kl_penalty(scores, logp, ref, mask, ada, "kl")
    # error = 0.325/0.25 - 1 = 0.3 -> clipped to 0.2 ; value *= 1 + 0.2 * 2 / 10
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5  # coefficient actually used
    assert ada.value == pytest.approx(0.5 * 1.04)


def test_adaptive_kl_controller_numbers():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=3.0, n_steps=256)
    # error = 3/6 - 1 = -0.5 -> clipped to -0.2 ; 0.1 * (1 - 0.2 * 256/10000) = 0.1 * 0.99488
    assert ctrl.value == pytest.approx(0.099488)
    ctrl.update(current_kl=6.6, n_steps=1000)
    # error = 6.6/6 - 1 = 0.1 (inside the clip) ; *= 1 + 0.1 * 1000/10000 = 1.01
    assert ctrl.value == pytest.approx(0.099488 * 1.01)


def test_make_kl_controller():
    fixed = make_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(fixed, FixedKLController)
    fixed.update(current_kl=100.0, n_steps=10)
    assert fixed.value == 0.05
    ada = make_kl_controller("adaptive", kl_coef=0.2, target_kl=1.0, horizon=100)
    assert isinstance(ada, AdaptiveKLController) and ada.value == 0.2
    with pytest.raises(ValueError, match="needs target_kl and horizon"):
        make_kl_controller("adaptive", kl_coef=0.2)
    with pytest.raises(ValueError, match=r"Unknown KL controller kind 'pid'.*'fixed', 'adaptive'"):
        make_kl_controller("pid", kl_coef=0.2)


# What `trainer.algorithms` exported before the workers' math moved to workers/rl_math/ (docs name the path).
PUBLIC_NAMES = (
    "ADVANTAGE_ESTIMATORS KL_PENALTY_NAMES LOSS_AGG_MODES AdaptiveKLController FixedKLController KLController agg_loss "
    "apply_kl_penalty compute_gae_advantage_return compute_grpo_outcome_advantage compute_policy_loss "
    "compute_reinforce_plus_plus_baseline_outcome_advantage compute_reinforce_plus_plus_outcome_advantage "
    "compute_remax_outcome_advantage compute_rloo_outcome_advantage compute_value_loss entropy_from_logits "
    "get_advantage_estimator kl_penalty log_probs_from_logits make_kl_controller last_valid_positions masked_mean "
    "masked_sum masked_var masked_whiten"
).split()


def test_trainer_algorithms_keeps_its_public_names():
    import trainer.algorithms as public

    assert sorted(public.__all__) == sorted(PUBLIC_NAMES)
    assert all(hasattr(public, name) for name in PUBLIC_NAMES)
    # The workers' math is re-exported, not copied: one function under both paths.
    assert public.agg_loss is agg_loss and public.masked_whiten is masked_whiten and public.kl_penalty is kl_penalty
