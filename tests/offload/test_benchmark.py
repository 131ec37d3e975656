"""benchmarks/offload.py on CPU at its tiny shape (host-to-host copies), and its per-phase offload table."""

from __future__ import annotations

import json

import pytest

from benchmarks.offload import Bandwidth, main, offload_table


def test_the_benchmark_round_trips_a_sharded_model_and_reports_against_the_bandwidth(tmp_path):
    out = tmp_path / "offload.json"
    result = main(["--shape", "tiny", "--round-trips", "3", "--probe-gib", "0.05", "--json", str(out)])
    assert json.loads(out.read_text())["shape"] == "tiny"
    trips = result["round_trips"]
    assert trips["state_unchanged"] and trips["forward_unchanged"]
    assert trips["host_allocations"] == 2  # parameters, optimizer state: once each over the 3 round trips
    assert len(trips["trips"]) == 3
    bandwidth = result["bandwidth"]
    for trip in trips["trips"]:
        assert trip["d2h_gib"] == trip["h2d_gib"] > 0
        ideal = (trip["d2h_gib"] * 2**30 / (bandwidth["d2h_gbps"] * 1e9)
                 + trip["h2d_gib"] * 2**30 / (bandwidth["h2d_gbps"] * 1e9))
        assert trip["overhead"] == pytest.approx((trip["offload_s"] + trip["load_s"]) / ideal)


def test_the_offload_table_takes_the_steady_steps_and_divides_by_what_the_bytes_need():
    history = [  # step 1 allocates the host buffers; steps 2 and 3 are the steady state
        {"offload/generate/h2d_gib": 0.0, "offload/generate/d2h_gib": 10.0, "offload/generate/seconds": 30.0},
        {"offload/generate/h2d_gib": 0.0, "offload/generate/d2h_gib": 10.0, "offload/generate/seconds": 0.5,
         "offload/update_actor/h2d_gib": 20.0, "offload/update_actor/d2h_gib": 20.0,
         "offload/update_actor/seconds": 2.0},
        {"offload/generate/h2d_gib": 0.0, "offload/generate/d2h_gib": 10.0, "offload/generate/seconds": 0.7,
         "offload/update_actor/h2d_gib": 20.0, "offload/update_actor/d2h_gib": 20.0,
         "offload/update_actor/seconds": 2.2, "offload/host_buffers_gib": 30.0},
    ]
    bandwidth = Bandwidth(h2d_gbps=50.0, d2h_gbps=40.0, probe_bytes=1 << 30, device="test")
    rows = {row["phase"]: row for row in offload_table(history, bandwidth)}
    assert list(rows) == ["generate", "update_actor"]
    assert rows["generate"]["seconds"] == pytest.approx(0.6)
    assert rows["generate"]["ideal_s"] == pytest.approx(10 * 2**30 / 40e9)
    assert rows["update_actor"]["overhead"] == pytest.approx(2.1 / (20 * 2**30 / 50e9 + 20 * 2**30 / 40e9))
    assert all(row["overhead"] is None for row in offload_table(history, None))
