"""benchmarks/moe_experts.py on CPU at the tiny shape: every experts implementation runs forward and backward,
and the grouped paths give the eager loop's outputs."""

import torch

from benchmarks.moe_experts import IMPLEMENTATIONS, active_flops, measure, table


def test_every_implementation_runs_and_agrees_with_the_eager_loop():
    rows = measure("tiny", tokens=64, repeats=1, device=torch.device("cpu"))
    assert [row.implementation for row in rows] == list(IMPLEMENTATIONS)
    for row in rows:
        assert row.ms > 0 and row.tflops > 0, row
        assert row.max_diff_vs_eager < 1e-5, row
    assert "| grouped_mm |" in table(rows)


def test_flops_count_the_active_experts_and_the_router():
    # tiny: hidden 128, 8 experts of width 64, 2 active: 2 x 3 x 128 x 64 + 128 x 8 = 50 176 per token
    assert active_flops("tiny", 10) == 6 * 10 * 50_176
