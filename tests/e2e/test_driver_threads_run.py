"""A run's loop (a user's own, here) runs with `trainer.driver_threads` torch threads in the driver, and the
count before comes back after the run."""

import torch

from tests.e2e.conftest import run_overrides
from trainer.config_loader import load_config
from trainer.launch import run_loop


class NoWorkers:
    def shutdown(self) -> None:
        pass


def test_a_loop_runs_with_the_drivers_thread_count_and_the_count_comes_back(ray_cluster, tiny_assets, tmp_path):
    seen = []

    class CountingLoop:
        def __init__(self, cfg, roles, data, tracker) -> None:
            pass

        def fit(self):
            seen.append(torch.get_num_threads())
            return []

    before = torch.get_num_threads()
    wanted = before + 1
    cfg = load_config(run_overrides(tiny_assets, tmp_path, f"trainer.driver_threads={wanted}", "trainer.save_at_end=false"))
    assert run_loop(cfg, lambda c: NoWorkers(), CountingLoop) == []
    assert seen == [wanted] and torch.get_num_threads() == before
