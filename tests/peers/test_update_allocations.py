"""e2e_step's summary of the update's allocator work, from the per-phase running counts the workers log."""

import math

from benchmarks.e2e_step import update_allocations


def _step(before_update: float, update: float, releases: float) -> dict[str, float]:
    return {
        "memory/generate/device_allocs_total": before_update - 50,
        "memory/ref_log_prob/device_allocs_total": before_update,
        "memory/update_actor/device_allocs_total": update,
        "actor/cached_block_releases": releases,
    }


def test_the_update_counts_its_own_allocations_in_the_steady_steps():
    history = [_step(1000, 3000, 9), _step(3100, 3400, 1), _step(3500, 3900, 3)]
    # step 1 (the warm-up) is left out: (300 + 400) / 2 allocations, (1 + 3) / 2 releases
    assert update_allocations(history) == {"update_actor_device_allocs": 350, "update_actor_cached_block_releases": 2}


def test_a_run_without_the_counts_gives_nan():
    summary = update_allocations([{"timing/step_s": 1.0}])
    assert all(math.isnan(v) for v in summary.values())
