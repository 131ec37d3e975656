"""The console line: the headline metrics, then the key metric of each feature the run's config turns on
(DAPO's dynamic sampling, asynchronous or one-step-off rollout, LoRA's adapter sync), and nothing of the
features it leaves off."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from trainer.config_loader import load_config
from trainer.trackers.console import ConsoleTracker

VLLM_SEPARATE = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate")
# What a step of each feature reports (the names the trainer and the workers log; tests/e2e and tests/rollout
# check them in real runs).
FEATURE_METRICS = {
    "filter_groups/mixed_groups": 6, "filter_groups/uniform_groups": 10, "filter_groups/gen_batches": 2,
    "rollout/staleness": 0.5, "rollout/staleness_max": 1, "async/dropped_groups": 0,
    "rollout/sync_bytes": 3 * 2**20,
}
HEADLINE = {"reward/mean": 0.25, "actor/pg_loss": -0.01, "timing/step_s": 1.5}


def _line(*overrides: str) -> str:
    lines: list[str] = []
    config = OmegaConf.to_container(load_config(list(overrides)), resolve=True)
    ConsoleTracker(print_fn=lines.append, config=config).log({**HEADLINE, **FEATURE_METRICS, "other/key": 1.0}, step=7)
    (line,) = lines
    return line


def test_a_plain_run_shows_the_headline_metrics_only():
    assert _line() == "step 7: reward/mean=0.25  actor/pg_loss=-0.01  timing/step_s=1.5"


@pytest.mark.parametrize(("overrides", "shown"), [
    (("algorithm=dapo",), "filter_groups/mixed_groups=6  filter_groups/uniform_groups=10  filter_groups/gen_batches=2"),
    ((*VLLM_SEPARATE, "actor_rollout_ref.rollout.async_training=true"),
     "rollout/staleness=0.5  rollout/staleness_max=1  async/dropped_groups=0"),
    ((*VLLM_SEPARATE, "actor_rollout_ref.rollout.staleness=1"), "rollout/staleness=0.5"),
    (("actor_rollout_ref.model.lora_rank=8",), "rollout/sync_bytes=3MiB"),
], ids=["dapo", "async", "one_step_off", "lora"])
def test_each_enabled_feature_adds_its_key_metrics(overrides, shown):
    assert _line(*overrides) == f"step 7: reward/mean=0.25  actor/pg_loss=-0.01  timing/step_s=1.5  {shown}"


def test_a_feature_metric_missing_from_a_step_is_left_out():
    lines: list[str] = []
    config = OmegaConf.to_container(load_config(["algorithm=dapo"]), resolve=True)
    tracker = ConsoleTracker(print_fn=lines.append, config=config)
    tracker.log({"reward/mean": 0.5, "filter_groups/gen_batches": 3}, step=1)
    assert lines == ["step 1: reward/mean=0.5  filter_groups/gen_batches=3"]
