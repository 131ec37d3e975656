"""workers/rollout/engine_start_memory.py: the figures vLLM's GPU worker keeps from its start-up profile, read from
an object laid out as that worker (vLLM's GPU worker needs CUDA; on CPU the hybrid runs of test_vllm_rollout.py
call the same method through vLLM's workers, which hold none of the figures)."""

from types import SimpleNamespace

import pytest

from workers.memory import GIB
from workers.rollout.engine_start_memory import start_memory_figures, start_memory_metrics


def test_each_figure_present_is_read_in_gib():
    worker = SimpleNamespace(
        peak_activation_memory=3 * GIB, non_torch_memory=GIB // 2, cudagraph_memory_estimate=0,
        available_kv_cache_memory_bytes=int(5.72 * GIB), model_runner=SimpleNamespace(model_memory_usage=57 * GIB),
    )
    figures = start_memory_figures(worker)
    assert figures == pytest.approx(
        {"activation_peak": 3.0, "non_torch": 0.5, "cuda_graphs": 0.0, "kv_cache": 5.72, "weights": 57.0}, abs=1e-9
    )
    assert start_memory_metrics(figures)["rollout/engine_memory/kv_cache_gib"] == pytest.approx(5.72)


def test_a_worker_without_the_profile_reports_nothing():
    # A fixed-size KV cache skips vLLM's profile: the attributes are unset, or None where vLLM declares them.
    assert start_memory_figures(SimpleNamespace(peak_activation_memory=None, model_runner=SimpleNamespace())) == {}
    assert start_memory_figures(SimpleNamespace()) == {}
