"""A short CPU run writes the MFU metrics to metrics.jsonl when a device peak is given (there is none on CPU
otherwise), each one its phase's model FLOPs over the phase's time, GPUs (here worker processes) and peak."""

import json

import pytest

from tests.e2e.conftest import run_overrides
from trainer.config_loader import load_config
from trainer.main import run

pytestmark = pytest.mark.slow
PHASES = ("generate", "old_log_prob", "ref_log_prob", "update_actor")


def test_mfu_in_metrics_jsonl(ray_cluster, tiny_assets, tmp_path):
    peak = 0.01  # TFLOP/s: a CPU figure, so the fractions are readable
    run(load_config(run_overrides(
        tiny_assets, tmp_path, "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.save_at_end=false", "trainer.device=cpu", "trainer.n_gpus_per_node=2", f"trainer.device_peak_tflops={peak}",
    )))
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "perf/tokens" in r]
    assert len(steps) == 2
    for record in steps:
        assert record["perf/device_peak_tflops"] == peak and record["perf/gpus"] == 2
        assert record["perf/tokens_per_s_per_gpu"] == pytest.approx(record["perf/tokens_per_s"] / 2)
        for phase in PHASES:
            expected = record[f"perf/tflop/{phase}"] / (record[f"timing/{phase}_s"] * 2 * peak)
            assert 0 < record[f"perf/mfu/{phase}"] == pytest.approx(expected)
        assert record["perf/tflop/update_actor"] == pytest.approx(3 * record["perf/tflop/old_log_prob"])
        assert "perf/hfu/update_actor" not in record  # no gradient checkpointing: nothing recomputed
