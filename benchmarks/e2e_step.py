"""GRPO steps on one GPU end to end: time per phase, tokens/s, the device's peak memory and the toolkit's own overhead.

    python -m benchmarks.e2e_step [--sizes 0.5B,1.5B] [--steps 4] [--engine vllm|hf] [--eager] [--reuse-model]
        [--out results/e2e_step.json] [overrides...]

Random-init Qwen2 models of the Qwen2.5-0.5B / 1.5B / 7B shapes (bf16 compute, FSDP2, one worker), the
arithmetic task, 16 prompts × 8 samples × 256 new tokens. The overhead figures are measured per step by
`trainer/overhead.py`: the wall time of every worker-group call minus the time inside the worker method
(dispatch, serialization, transfer, scheduling, collect), plus driver time outside calls that is not the
algorithm's own math. Steady state = the mean over steps 2..N (step 1 includes CUDA/NCCL/vLLM warm-up).
Next to each phase's time: its MFU (`perf/mfu/<phase>`, trainer/perf_metrics.py) where the GPU's peak is known.
`--reuse-model` keeps a model folder an earlier run wrote (benchmarks/peers writes one for every side).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_grpo_step import build_model, grpo_overrides
from benchmarks.model_shapes import QWEN2_0_5B, QWEN2_14B, QWEN2_1_5B, QWEN2_32B, QWEN2_7B
from benchmarks.random_model import write_model_folder
from benchmarks.steady_state import steady
from trainer.config_loader import load_config
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.main import run
from trainer.memory_plan.shape import ModelShape

SHAPES = {
    "0.5B": QWEN2_0_5B,
    "1.5B": QWEN2_1_5B,
    # CPU dry runs of the GPU scripts (benchmarks/peers): head_dim 64, which vLLM's CPU backend accepts.
    "tiny": dict(QWEN2_0_5B, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=256, vocab_size=128, max_position_embeddings=512),
    # Qwen2.5-7B: ~15 GB of bf16 weights; one H200 fits it with LoRA or with the actor offloaded (docs/lora.md).
    "7B": QWEN2_7B,
    # Qwen2.5-14B / -32B: the four-GPU runs (docs/benchmarks.md); their folders are written by one process per GPU.
    "14B": QWEN2_14B,
    "32B": QWEN2_32B,
}
PHASES = ("sync_weights", "generate", "reward", "old_log_prob", "ref_log_prob", "advantage", "update_actor")
# Above this many parameters a model folder is written by benchmarks/random_model.py (bf16 shards drawn on the
# GPU in a child process: a 7B folder in 30-45 s) instead of building the model in host memory.
LARGE_MODEL_PARAMS = 2_000_000_000


def written_params(folder: Path) -> int | None:
    """The parameter count of a complete bf16 model folder written before, or None when there is none."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.exists() and (folder / "config.json").exists():
        return json.loads(index.read_text())["metadata"]["total_size"] // 2
    single = folder / "model.safetensors"
    if not single.exists() or not (folder / "config.json").exists():
        return None
    with safe_open(str(single), framework="pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())


def model_folder(folder: Path, shape: dict, reuse: bool = False) -> int:
    """The random-init model folder of `shape` at `folder` (kept as it is with `reuse` when complete); #params."""
    if reuse and (params := written_params(folder)) is not None:
        return params
    if ModelShape.from_config({**shape, "model_type": "qwen2"}).total_params() > LARGE_MODEL_PARAMS:
        return write_model_folder(folder, shape)
    return build_model(folder, shape)


def engine_overrides(engine: str, eager: bool) -> list[str]:
    if engine == "hf":
        return ["actor_rollout_ref.rollout.name=hf"]
    # Hybrid vLLM (CUDA graphs unless --eager); no actor offload (the models fit), sleep mode on.
    return ["actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.enforce_eager={str(eager).lower()}",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.4"]


def phase_summary(history: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's steady time, and next to it its MFU (perf/mfu/<phase>) and, with gradient checkpointing,
    HFU where the run logged them (a GPU of known peak, or trainer.device_peak_tflops)."""
    summary: dict[str, float] = {}
    for phase in PHASES:
        summary[f"{phase}_s"] = steady(history, f"timing/{phase}_s")
        for kind in ("mfu", "hfu"):
            if any(f"perf/{kind}/{phase}" in r for r in history):
                summary[f"{phase}_{kind}"] = steady(history, f"perf/{kind}/{phase}")
    return summary


def update_allocations(history: list[dict[str, float]]) -> dict[str, float]:
    """The update's allocator work, steady: device allocations in the update phase (its running count less the
    highest count the step's earlier phases reached) and how often the update emptied the cache."""
    update_key = "memory/update_actor/device_allocs_total"
    per_step = [
        {"allocs": r[update_key] - max(v for k, v in r.items() if k.endswith("/device_allocs_total") and k != update_key)}
        for r in history if update_key in r and sum(k.endswith("/device_allocs_total") for k in r) > 1
    ]
    return {
        "update_actor_device_allocs": steady(per_step, "allocs"),
        "update_actor_cached_block_releases": steady(history, "actor/cached_block_releases"),
    }


def run_size(size: str, work: Path, steps: int, engine: str, eager: bool, extra: list[str], reuse_model: bool = False) -> dict[str, Any]:
    params = model_folder(work / size / "model", SHAPES[size], reuse_model)
    train, val = write_synthetic_dataset(work / size / "data", train_size=256, val_size=16, tasks=("arithmetic",))
    overrides = grpo_overrides(work / size, train, val, steps, "[jsonl]") + [*engine_overrides(engine, eager), *extra]
    start = time.perf_counter()
    history = run(load_config(overrides))
    summary: dict[str, Any] = {"size": size, "params": params, "engine": engine, "run_s": time.perf_counter() - start}
    summary.update(phase_summary(history))
    summary.update(update_allocations(history))
    for key in ("timing/step_s", "perf/tokens", "perf/tokens_per_s", "perf/tokens_per_s_per_gpu", "perf/device_peak_tflops",
                "overhead/calls_s", "overhead/in_workers_s", "overhead/dispatch_collect_s", "overhead/driver_s",
                "overhead/toolkit_s", "overhead/toolkit_share", "rollout/sync_s", "rollout/generate_s",
                "rollout/kv_cache_sequences", "agent/turns_mean", "agent/tool_use_rate", "agent/model_tokens_mean",
                "agent/tool_tokens_mean"):
        summary[key.split("/")[-1] if key.startswith("overhead") else key.replace("/", "_")] = steady(history, key)
    # The device's highest use in any phase (NVML, sampled in the worker). Not the allocator's peak: with the hybrid
    # engine (the default) PyTorch also counts the engine's pool while it sleeps unmapped (workers/memory.py).
    peaks = [v for r in history for k, v in r.items() if k.endswith("/gpu_used_peak_gib")]
    summary["gpu_used_peak_gib"] = max(peaks) if peaks else float("nan")
    used = [v for r in history for k, v in r.items() if k.endswith("gpu_used_gib")]
    summary["max_gpu_used_gib"] = max(used) if used else float("nan")
    return {"summary": summary, "history": history, "overrides": overrides}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.5B,1.5B")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--engine", default="vllm", choices=("vllm", "hf"))
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs")
    parser.add_argument("--reuse-model", action="store_true", help="keep a complete model folder already in --workdir")
    parser.add_argument("--workdir", default="/tmp/e2e_step")
    parser.add_argument("--out", default="results/e2e_step.json")
    args, extra = parser.parse_known_args()
    results = []
    for size in args.sizes.split(","):
        results.append(run_size(size, Path(args.workdir), args.steps, args.engine, args.eager, extra, args.reuse_model))
        write(args, extra, results)  # after each size, so a later failure keeps what was measured
    summaries = [r["summary"] for r in results]
    print(f"\n{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}, engine {args.engine}, steady state (mean of steps 2..{args.steps})")
    print("measure".ljust(30) + "".join(s["size"].rjust(12) for s in summaries))
    for key in summaries[0]:
        if key in ("size", "engine"):
            continue
        values = [s.get(key, float("nan")) for s in summaries]
        print(key.ljust(30) + "".join(f"{v:12.3f}" if isinstance(v, float) else f"{v:>12}" for v in values))
    print(f"wrote {args.out}")


def write(args: argparse.Namespace, extra: list[str], results: list[dict[str, Any]]) -> None:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    Path(args.out).write_text(json.dumps({"device": device, "args": vars(args), "extra": extra, "results": results}, indent=2))


if __name__ == "__main__":
    main()
