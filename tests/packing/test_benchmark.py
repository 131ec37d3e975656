"""`benchmarks/packing.py` runs on CPU (tiny shape) and its packed log-probs match the padded ones."""

from __future__ import annotations

import json

import pytest

from benchmarks.packing import main


@pytest.mark.slow
def test_packing_benchmark_tiny_cpu_run(tmp_path):
    out = tmp_path / "packing.json"
    report = main(["--sizes", "tiny", "--rows", "6", "--max-prompt", "16", "--max-response", "48",
                   "--max-tokens", "128", "--gradient-checkpointing", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    padded, packed = report["rows"]
    assert (padded["mode"], packed["mode"]) == ("padded", "packed")
    assert packed["real_tokens"] < packed["padded_tokens"]
    assert packed["logprob_gap_max"] < 1e-5  # fp32 on CPU: the same numbers
    assert packed["speedup"] > 0 and padded["update_s"] > 0
    assert report["attention_kernel"] == "per_sequence_sdpa"
