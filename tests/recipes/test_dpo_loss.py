"""dpo_loss against hand-computed values (sigmoid, label smoothing, IPO, hinge) and its argument checks."""

import math

import pytest
import torch

from workers.rl_math.dpo import dpo_loss

T = torch.tensor


def one_pair(beta, loss_type="sigmoid", label_smoothing=0.0):
    # policy chosen -1, rejected -3; reference both -2: h = (-1 - -3) - (-2 - -2) = 2
    return dpo_loss(T([-1.0]), T([-3.0]), T([-2.0]), T([-2.0]), beta, loss_type, label_smoothing)


def test_sigmoid_loss_and_implicit_rewards():
    losses, chosen, rejected = one_pair(beta=0.5)
    assert losses.item() == pytest.approx(math.log(1 + math.exp(-1.0)))  # -log sigmoid(0.5 * 2)
    assert chosen.item() == pytest.approx(0.5)  # 0.5 * (-1 - -2)
    assert rejected.item() == pytest.approx(-0.5)  # 0.5 * (-3 - -2)


def test_sigmoid_at_the_reference_is_log_2():
    losses, chosen, rejected = dpo_loss(T([-4.0, -1.0]), T([-2.0, -7.0]), T([-4.0, -1.0]), T([-2.0, -7.0]), beta=0.1)
    assert losses.tolist() == pytest.approx([math.log(2)] * 2)
    assert chosen.tolist() == [0.0, 0.0] and rejected.tolist() == [0.0, 0.0]


def test_label_smoothing_mixes_in_the_flipped_label():
    losses, _, _ = one_pair(beta=0.5, label_smoothing=0.1)
    expected = 0.9 * math.log(1 + math.exp(-1.0)) + 0.1 * math.log(1 + math.exp(1.0))
    assert losses.item() == pytest.approx(expected)


def test_ipo_targets_a_gap_of_one_over_two_beta():
    assert one_pair(beta=0.5, loss_type="ipo")[0].item() == pytest.approx(1.0)  # (2 - 1) ** 2
    assert one_pair(beta=0.1, loss_type="ipo")[0].item() == pytest.approx(9.0)  # (2 - 5) ** 2
    assert one_pair(beta=0.25, loss_type="ipo")[0].item() == pytest.approx(0.0)  # (2 - 2) ** 2


def test_hinge_is_zero_past_a_margin_of_one_over_beta():
    assert one_pair(beta=0.5, loss_type="hinge")[0].item() == pytest.approx(0.0)  # relu(1 - 1)
    assert one_pair(beta=0.1, loss_type="hinge")[0].item() == pytest.approx(0.8)  # relu(1 - 0.2)
    losses, _, _ = dpo_loss(T([-3.0]), T([-1.0]), T([-2.0]), T([-2.0]), 0.5, "hinge")  # h = -2
    assert losses.item() == pytest.approx(2.0)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
def test_gradient_raises_chosen_and_lowers_rejected(loss_type):
    chosen, rejected = T([-3.0], requires_grad=True), T([-3.0], requires_grad=True)
    losses, chosen_reward, _ = dpo_loss(chosen, rejected, T([-3.0]), T([-3.0]), 0.1, loss_type)
    losses.sum().backward()
    assert chosen.grad.item() < 0 < rejected.grad.item()
    assert not chosen_reward.requires_grad  # rewards are metrics only


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"loss_type": "kto"}, "loss_type"),
        ({"beta": 0.0}, "beta"),
        ({"label_smoothing": 0.5}, "label_smoothing"),
        ({"loss_type": "ipo", "label_smoothing": 0.1}, "sigmoid"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {"beta": 0.1, **kwargs}
    with pytest.raises(ValueError, match=match):
        dpo_loss(T([-1.0]), T([-2.0]), T([-1.0]), T([-2.0]), **args)
