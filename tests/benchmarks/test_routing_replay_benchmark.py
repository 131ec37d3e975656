"""benchmarks/routing_replay.py: the two runs it compares differ only in the replay setting, and each run's
measures are read from its logged steps."""

from pathlib import Path

import pytest

from benchmarks.routing_replay import side_command, summarize


def test_the_two_sides_differ_only_in_the_replay_mode():
    live, r3 = (side_command(side, Path("w") / side, 5, ["trainer.seed=3"]) for side in ("live", "R3"))
    assert set(r3) - set(live) == {"actor_rollout_ref.actor.router_replay.mode=R3", "trainer.default_local_dir=w/R3"}
    assert "actor_rollout_ref.rollout.enable_rollout_routing_replay=true" in live
    assert live[-1] == "trainer.seed=3"  # the caller's overrides come last, so they win


def test_measures_are_averaged_over_all_steps_and_after_the_first():
    rows = [
        {"router_replay/mismatch_log_prob": 0.2, "reward/mean": 0.1},
        {"router_replay/mismatch_log_prob": 0.1, "reward/mean": 0.3},
        {"router_replay/mismatch_log_prob": 0.3, "reward/mean": 0.5},
    ]
    summary = summarize(rows)
    assert summary["steps"] == 3
    assert summary["mismatch_log_prob"]["mean"] == pytest.approx(0.2)
    assert summary["mismatch_log_prob"]["after_step_1"] == pytest.approx(0.2)
    assert summary["reward"] == pytest.approx({"mean": 0.3, "after_step_1": 0.4, "last": 0.5})
    assert summary["logprob_gap_mean"] == {"mean": None, "after_step_1": None, "last": None}  # not logged: none
