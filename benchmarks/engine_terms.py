"""The memory plan's terms for a vLLM engine beside what vLLM measured at its start (`rollout/engine_memory/*_gib`,
logged at a hybrid engine's first step on a GPU): which term of the plan's KV-cache estimate is off, and by how much."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from trainer.memory_plan.engine_concurrency import engine_concurrency
from trainer.memory_plan.engine_profile import SLEEPING_ENGINE_BYTES, profile_peak_bytes
from trainer.memory_plan.gpu import GIB
from trainer.memory_plan.plan import engine_weight_bytes
from trainer.memory_plan.setup import plan_setup
from workers.rollout.engine_start_memory import start_memory_key


def planned_terms(cfg: DictConfig, gpu_bytes: int | None) -> dict[str, float]:
    """The plan's engine terms on one GPU, in GiB; {} without a vLLM engine on GPUs of known size."""
    setup = plan_setup(cfg, on_gpu=True)
    found = engine_concurrency(setup, gpu_bytes)
    if found is None:
        return {}
    return {
        "weights": engine_weight_bytes(setup) / GIB,
        "activation_peak": profile_peak_bytes(setup, gpu_bytes) / GIB,
        "cuda_graphs + non_torch": SLEEPING_ENGINE_BYTES / GIB,
        "kv_cache": found.kv_bytes / GIB,
        "sequences at once": float(found.at_once),
    }


def measured_terms(history: list[dict[str, Any]]) -> dict[str, float]:
    """vLLM's figures from the first step that logged them, named as in `planned_terms`; {} where none was logged."""
    first = next((r for r in history if start_memory_key("kv_cache") in r), None)
    if first is None:
        return {}
    graphs = first.get(start_memory_key("cuda_graphs"), 0.0) + first.get(start_memory_key("non_torch"), 0.0)
    terms = {name: first[start_memory_key(name)] for name in ("weights", "activation_peak", "kv_cache")
             if start_memory_key(name) in first}
    terms["cuda_graphs + non_torch"] = graphs
    if "rollout/kv_cache_sequences" in first:
        terms["sequences at once"] = first["rollout/kv_cache_sequences"]
    return terms


def print_comparison(planned: dict[str, float], measured: dict[str, float]) -> None:
    if not planned or not measured:
        return
    print("  vLLM engine per GPU (GiB)      plan  vLLM measured")
    for name, value in planned.items():
        seen = measured.get(name)
        print(f"  {name.ljust(28)}{value:8.2f}" + (f"{seen:15.2f}" if seen is not None else "              -"))
