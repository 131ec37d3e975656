"""What vLLM's GPU worker measured at its start before it sized the KV cache: its weights, the profile run's
activation peak, the memory outside PyTorch, the CUDA graphs' estimate and the cache it then took. These are the
terms the memory plan estimates for the engine (trainer/memory_plan/engine_profile.py); reported once as start
metrics, a run shows which of them its plan got wrong. vLLM keeps them as attributes of its worker and model
runner (its internals: read where present; a KV cache of a fixed size skips the profile, and vLLM's CPU worker
keeps none)."""

from __future__ import annotations

from typing import Any

from workers.memory import GIB

# vLLM's attribute -> the figure's name in `rollout/engine_memory/<name>_gib`
WORKER_FIGURES = {
    "peak_activation_memory": "activation_peak",
    "non_torch_memory": "non_torch",
    "cudagraph_memory_estimate": "cuda_graphs",
    "available_kv_cache_memory_bytes": "kv_cache",
}
MODEL_RUNNER_FIGURES = {"model_memory_usage": "weights"}


def start_memory_figures(worker: Any) -> dict[str, float]:
    """The figures `worker` (vLLM's worker object) holds, in GiB, by their names above."""
    figures = {}
    sources = ((worker, WORKER_FIGURES), (getattr(worker, "model_runner", None), MODEL_RUNNER_FIGURES))
    for owner, names in sources:
        for attribute, name in names.items():
            value = getattr(owner, attribute, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                figures[name] = value / GIB
    return figures


def start_memory_key(name: str) -> str:
    """The metric a figure of `start_memory_figures` is logged as."""
    return f"rollout/engine_memory/{name}_gib"


def start_memory_metrics(figures: dict[str, float]) -> dict[str, float]:
    return {start_memory_key(name): value for name, value in figures.items()}
