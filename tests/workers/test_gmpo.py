"""GMPO (`policy_loss.loss_mode=geo_mean`): the geometric mean of pessimistically clipped token ratios per response."""

import math

import pytest
import torch

from workers.rl_math.losses import compute_policy_loss


def policy_loss(log_prob, old, advantages, mask, low=0.2, high=0.2, weights=None):
    return compute_policy_loss(old, log_prob, advantages, mask, clip_ratio_low=low, clip_ratio_high=high,
                               loss_agg_mode="token-mean", token_weights=weights, loss_mode="geo_mean")


def test_the_clip_is_pessimistic_per_token_in_log_space():
    log_prob = torch.tensor([[0.1, 0.3, 0.0], [-0.1, -0.5, 0.0]], requires_grad=True)
    old = torch.zeros(2, 3)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    out = policy_loss(log_prob, old, advantages, mask)
    # A > 0: the log-ratio 0.3 is cut to 0.2; A < 0: -0.5 is raised to -0.2 (both lower the objective A * s).
    expected = (-math.exp((0.1 + 0.2) / 2) + math.exp((-0.1 - 0.2) / 2)) / 2
    assert out["pg_loss"].item() == pytest.approx(expected, rel=1e-6)
    assert out["pg_clipfrac"].item() == pytest.approx(0.5)
    out["pg_loss"].backward()
    grad = log_prob.grad
    assert grad[0, 0] != 0 and grad[1, 0] != 0  # unclipped tokens learn
    assert grad[0, 1] == 0 and grad[1, 1] == 0  # clipped ones do not, and padding never does
    assert grad[:, 2].abs().sum() == 0


def test_one_loss_per_response_whatever_its_length():
    old = torch.zeros(2, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    advantages = torch.tensor([[1.0] * 4, [2.0] * 4])
    out = policy_loss(torch.zeros(2, 4), old, advantages, mask)
    assert out["pg_loss"].item() == pytest.approx(-(1.0 + 2.0) / 2)  # ratios 1: the mean of -A over responses


def test_importance_weights_enter_as_their_geometric_mean():
    mask = torch.ones(1, 2)
    weights = torch.tensor([[0.5, 2.0]])  # geometric mean 1
    plain = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), mask)
    weighted = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), mask, weights=weights)
    assert weighted["pg_loss"].item() == pytest.approx(plain["pg_loss"].item())
    halved = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), mask, weights=torch.full((1, 2), 0.5))
    assert halved["pg_loss"].item() == pytest.approx(plain["pg_loss"].item() / 2)


def test_the_config_accepts_verls_name():
    from trainer.config_loader import load_config

    cfg = load_config(["actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean", "actor_rollout_ref.actor.clip_ratio_low=0.4"])
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "geo_mean"
