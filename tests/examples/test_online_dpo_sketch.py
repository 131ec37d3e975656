"""The README's main job: the online DPO sketch learns (loss down, score up) on the shared cluster."""

import numpy as np
import pytest

from examples.online_dpo_sketch import main_task


@pytest.mark.slow
def test_online_dpo_sketch_loss_goes_down_and_score_goes_up(ray_cluster):
    history = ray_cluster.get(main_task.remote({"seed": 0, "steps": 24, "batch_size": 16, "samples_per_prompt": 4}))
    assert len(history) == 24
    loss = [h["dpo_loss"] for h in history]
    score = [h["score"] for h in history]
    assert np.mean(loss[-5:]) < np.mean(loss[:5]) - 0.1
    assert np.mean(score[-5:]) > np.mean(score[:5]) + 0.1
    assert all(0 < h["pairs"] <= 16 for h in history)
