"""form_pairs: best vs worst per prompt, ties and single-sample groups dropped and counted, any group size."""

import numpy as np
import pytest
import torch

from trainer.algorithms.pairs import form_pairs


def test_best_vs_worst_with_ties_dropped_and_uneven_groups():
    scores = [0.2, 0.8, 0.8, 0.1, 0.5, 0.5, 0.3, 0.0, 1.0, 0.5]
    groups = ["a", "a", "a", "a", "b", "b", "c", "d", "d", "d"]
    chosen, rejected, dropped = form_pairs(scores, groups)
    # a: first of the two 0.8s vs 0.1; b: all equal -> dropped; c: one sample -> dropped; d: 1.0 vs 0.0
    assert chosen.tolist() == [1, 8]
    assert rejected.tolist() == [3, 7]
    assert dropped == 2


def test_all_equal_everywhere_gives_no_pair():
    chosen, rejected, dropped = form_pairs(torch.full((6,), 0.25), np.array(["x", "x", "x", "y", "y", "y"], dtype=object))
    assert chosen.tolist() == [] and rejected.tolist() == [] and dropped == 2
    assert chosen.dtype == np.int64


def test_groups_need_not_be_contiguous_and_keep_first_appearance_order():
    scores = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.5])
    groups = [7, 3, 7, 3, 3]  # group 7 appears first
    chosen, rejected, dropped = form_pairs(scores, groups)
    assert list(zip(chosen.tolist(), rejected.tolist())) == [(2, 0), (1, 3)]
    assert dropped == 0


def test_tie_at_the_bottom_only_still_pairs_first_worst():
    chosen, rejected, dropped = form_pairs([0.5, 0.1, 0.1], ["g"] * 3)
    assert (chosen.tolist(), rejected.tolist(), dropped) == ([0], [1], 0)


def test_mismatched_or_non_finite_inputs_raise():
    with pytest.raises(ValueError, match="same length"):
        form_pairs([0.1, 0.2], ["a"])
    with pytest.raises(ValueError, match="finite"):
        form_pairs([0.1, float("nan")], ["a", "a"])
