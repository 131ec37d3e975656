"""`benchmarks/ulysses_memory.py`: its default size is one the memory plan says needs Ulysses on 80 GiB GPUs,
and the script runs end to end on CPU (gloo) at its toy size, Ulysses size 2 in a process of its own (attached to
the session's Ray cluster through RAY_ADDRESS, as on a machine with a cluster running: a local cluster of its own
would cost the child Ray's start). Size 1, the same child without sequence parallelism, is left to the GPU runs:
on CPU it would double the test's time and check no path size 2 does not."""

from __future__ import annotations

import json

import pytest

from benchmarks.random_model import write_config
from benchmarks.ulysses_memory import PHASES, main, plan_rows, shape_of


def _args(tiny: bool, tokens: int, sequence_tokens: int):
    import argparse

    return argparse.Namespace(tiny=tiny, tokens=tokens, sequence_tokens=sequence_tokens)


def test_the_default_size_needs_two_gpus_per_sequence(tmp_path):
    args = _args(False, 327680, 32768)
    write_config(tmp_path, shape_of(args))
    one, two = (plan_rows(args, tmp_path, size, 80.0) for size in (1, 2))
    assert one["fits"] is False and two["fits"] is True
    assert one["phases"]["update_actor"] > 80.0 > two["phases"]["update_actor"]
    # Only the token-proportional columns drop: the model state is sharded over both GPUs at either size.
    assert two["parts"]["update_actor"]["activations"] == pytest.approx(one["parts"]["update_actor"]["activations"] / 2, rel=1e-3)
    assert two["parts"]["update_actor"]["optimizer"] == one["parts"]["update_actor"]["optimizer"]


@pytest.mark.slow
def test_tiny_cpu_run(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.get_runtime_context().gcs_address)  # the children inherit it
    out = tmp_path / "out"
    results = main(["--tiny", "--sizes", "2", "--workdir", str(tmp_path / "work"), "--out", str(out)])
    written = json.loads((out / "ulysses_memory.json").read_text())
    assert [r["size"] for r in written["results"]] == [2] and written["tokens"] == 96
    for result in results:
        assert result["error"] is None and result["out_of_memory"] is None, result
        assert set(result["phases"]) == {"init", *PHASES}
        assert all(reading["rss_gib"] > 0 for reading in result["phases"].values())  # CPU: host memory readings
        assert result["plan"]["fits"] is True
