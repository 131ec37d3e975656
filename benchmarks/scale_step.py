"""GRPO steps of 3B/7B-class models on one GPU, with the memory plan's estimate next to each measured peak.

    python -m benchmarks.scale_step --sizes 7B [--layers N] [--lora-rank 64] [--steps 3] [--prompts 8] [--n 8]
        [--response-length 512] [--micro-rows 8 | --token-budget 16384 [--log-prob-budget N]] [--force]
        [--workdir /tmp/scale_step] [--out results/scale_step.json] [overrides...]

Random-init Qwen2 models of the Qwen2.5-7B / -3B shapes, or the Qwen3-30B-A3B mixture of experts (`30B-A3B`;
`--layers N` keeps its first N decoder layers, so that one GPU holds it), written in bf16 by
benchmarks/random_model.py in a child process, the arithmetic task, GRPO with the reference KL loss, FSDP2 (bf16
compute, float32 master weights) with parameter and optimizer offload and gradient checkpointing, packed
sequences (`--strategy megatron`: the Megatron actor, padded, with its weight, gradient and optimizer offload), the
hybrid vLLM engine with sleep mode; `--lora-rank 64` trains LoRA adapters instead
(actor_rollout_ref.model.lora_rank), their frozen base shared with the engine by default
(actor_rollout_ref.rollout.share_base_weights=false: two copies).
Before running, the memory plan (trainer/memory_plan) is printed; a size whose plan does not fit the GPU is
skipped unless `--force`. Per phase: time (steady state = mean of steps 2..N), the plan's estimate and the
measured peak: `gpu_used_peak_gib`, the whole device's highest use during the phase (NVML, sampled in the
worker), next to the device use at the phase's end. The allocator's per-phase peak (`peak_allocated_gib`) is
not shown: the hybrid engine lives in the worker's process, and PyTorch counts its memory pool (weights, KV
cache) even while it sleeps with that memory unmapped, so the figure is the engine's share plus the phase's
and exceeded the GPU (182.5 GiB in a 7B update on a 140 GiB H200: workers/memory.py). Per phase also the offload
traffic (the workers' `offload/<phase>/...` metrics: GiB each way, seconds moving) against the page-locked
host<->device bandwidth measured at the start of the same run (benchmarks/offload.py, in a child process),
as a multiple of bytes / bandwidth. `--sizes tiny` runs a small shape on CPU (vLLM's CPU build), to check
the script itself.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.e2e_step import phase_summary, write
from benchmarks.engine_terms import measured_terms, planned_terms, print_comparison
from benchmarks.gpu_grpo_step import grpo_overrides
from benchmarks.model_shapes import QWEN2_0_5B, QWEN2_3B, QWEN2_7B, QWEN2_14B, QWEN2_32B, QWEN3_30B_A3B
from benchmarks.offload import Bandwidth, offload_table, print_offload_table, probe_in_subprocess
from benchmarks.random_model import write_config, write_model_folder
from benchmarks.steady_state import steady
from trainer.config_loader import load_config
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.main import run
from trainer.memory_plan import GIB, build_plan, gpu_memory, render_plan

SHAPES = {
    "7B": QWEN2_7B,
    "14B": QWEN2_14B,
    "32B": QWEN2_32B,
    "3B": QWEN2_3B,
    "30B-A3B": QWEN3_30B_A3B,
    # head_dim 64: the CPU vLLM backend accepts it.
    "tiny": dict(QWEN2_0_5B, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=256, vocab_size=256, tie_word_embeddings=False),
}
SHAPES["tiny-moe"] = dict(QWEN3_30B_A3B, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=64, moe_intermediate_size=64, num_experts=4,
                          num_experts_per_tok=2, vocab_size=256)


def shape_of(size: str, layers: int | None) -> tuple[str, dict[str, Any]]:
    """The size's name and shape, cut to its first `layers` decoder layers when given (every layer is the real
    layer: one GPU then holds a model whose per-token work is the full model's)."""
    if not layers:
        return size, SHAPES[size]
    return f"{size}-{layers}L", dict(SHAPES[size], num_hidden_layers=layers)


# Each worker memory reading (memory/<phase>/...) covers the time since the previous one, in this order; a
# plan phase with no reading of its own falls into the next reading (e.g. the reference's log-probs into
# update_actor when the worker records none for them).
MEASURED_ORDER = ("init", "sync", "generate", "old_log_prob", "ref_log_prob", "update_actor")
PLAN_PHASE = {"init": "init", "sync": "generate", "generate": "generate", "old_log_prob": "old_log_prob",
              "ref_log_prob": "ref_log_prob", "update_actor": "update_actor"}
TOLERANCE = 0.15


# Each strategy's offload switches, all on (the Megatron ones are verl's megatron.* keys), and whether it packs.
STRATEGY_OVERRIDES = {
    "fsdp": ("actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.actor.fsdp_config.param_offload=true",
             "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"),
    # Megatron runs padded micro-batches (no packing without Transformer Engine: docs/megatron.md).
    "megatron": ("actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.use_remove_padding=false",
                 *(f"actor_rollout_ref.actor.megatron.{key}=true" for key in ("param_offload", "grad_offload",
                                                                              "optimizer_offload"))),
}


def scale_overrides(args: argparse.Namespace, on_gpu: bool) -> list[str]:
    """The scale setup on top of the GPU GRPO benchmark's (later overrides win)."""
    overrides = [
        f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
        f"data.max_response_length={args.response_length}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_rows}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro_rows}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.micro_rows}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true", *STRATEGY_OVERRIDES[args.strategy],
        "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        *(["actor_rollout_ref.rollout.enforce_eager=true"] if args.eager else []),  # default: CUDA graphs on a GPU
    ]
    if not on_gpu:
        overrides.append("trainer.device=cpu")
    if args.token_budget:  # micro-batches filled up to a token budget (log-prob passes: twice it) instead of rows
        overrides += [
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.token_budget}",
            f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={args.log_prob_budget or 2 * args.token_budget}",
        ]
    if args.lora_rank:
        overrides.append(f"actor_rollout_ref.model.lora_rank={args.lora_rank}")
    if args.force:
        overrides.append("trainer.memory_check=warn")
    return overrides


def measured_windows(history: list[dict[str, Any]]) -> list[str]:
    return [p for p in MEASURED_ORDER if any(f"memory/{p}/gpu_used_gib" in r or f"memory/{p}/rss_gib" in r for r in history)]


def estimate_for(window: str, windows: list[str], plan: Any) -> float | None:
    """GiB: the plan's highest phase among those whose memory falls into this reading."""
    start = MEASURED_ORDER.index(windows[windows.index(window) - 1]) + 1 if windows.index(window) else 0
    phases = {PLAN_PHASE[p] for p in MEASURED_ORDER[start : MEASURED_ORDER.index(window) + 1]}
    rows = [plan.row(p) for p in phases]
    totals = [r.total for r in rows if r is not None]
    return max(totals) / GIB if totals else None


def memory_table(history: list[dict[str, Any]], plan: Any) -> list[dict[str, Any]]:
    """Per worker reading: the estimate, the measured peaks (highest over the steps) and measured / estimate."""
    windows = measured_windows(history)
    table = []
    for window in windows:
        def highest(key: str) -> float:
            values = [r[f"memory/{window}/{key}"] for r in history if f"memory/{window}/{key}" in r]
            return max(values) if values else float("nan")

        estimate = estimate_for(window, windows, plan)
        peak = highest("gpu_used_peak_gib")
        entry = {"phase": window, "estimate_gib": estimate, "measured_peak_gib": peak, "end_gib": highest("gpu_used_gib"),
                 "rss_gib": highest("rss_gib")}
        entry["ratio"] = peak / estimate if estimate and peak == peak else float("nan")
        entry["within_tolerance"] = abs(entry["ratio"] - 1) <= TOLERANCE if entry["ratio"] == entry["ratio"] else None
        table.append(entry)
    return table


def run_size(size: str, args: argparse.Namespace, extra: list[str], bandwidth: Bandwidth | None) -> dict[str, Any]:
    on_gpu = torch.cuda.is_available()
    size, shape = shape_of(size, args.layers)
    model_dir = Path(args.workdir) / size / "model"  # one folder per size, shared by its full and LoRA runs
    work = Path(args.workdir) / (size if not args.lora_rank else f"{size}_lora{args.lora_rank}")
    write_config(model_dir, shape)  # the plan needs only the config; the weights come if it fits
    train, val = write_synthetic_dataset(work / "data", train_size=256, val_size=16, tasks=("arithmetic",))
    overrides = grpo_overrides(work, train, val, args.steps, "[jsonl]") + scale_overrides(args, on_gpu)
    overrides += [f"actor_rollout_ref.model.path={model_dir}", *extra]
    cfg = load_config(overrides)
    gpu_bytes, gpu_source = gpu_memory(cfg)  # read once: detection queries the driver
    plan = build_plan(cfg, gpu_bytes, gpu_source)
    engine_plan = planned_terms(cfg, gpu_bytes) if on_gpu else {}
    plan_text = render_plan(plan)
    plan_rows = [{"group": g.name, "role": r.role, "phase": r.phase, "moment": r.moment, "total_gib": r.total / GIB,
                  **{f"{c}_gib": v / GIB for c, v in r.parts.items()}} for g in plan.groups for r in g.rows]
    print(f"\n{size} (LoRA rank {args.lora_rank})\n{plan_text}")
    result: dict[str, Any] = {"size": size, "lora_rank": args.lora_rank, "plan": plan_text, "plan_rows": plan_rows, "overrides": overrides}
    if plan.fits() is False and not args.force:
        result["skipped"] = "the memory plan does not fit the GPU (--force runs it anyway)"
        return result
    start = time.perf_counter()
    index = model_dir / "model.safetensors.index.json"
    if index.exists():  # written by an earlier run of this size (e.g. the full run before the LoRA one)
        result["params"] = json.loads(index.read_text())["metadata"]["total_size"] // 2  # bf16
    else:
        result["params"] = write_model_folder(model_dir, shape)
    result["build_s"] = time.perf_counter() - start
    print(f"{result['params'] / 1e9:.2f} B parameters, model folder ready in {result['build_s']:.1f} s")
    start = time.perf_counter()
    history = run(cfg)
    result["run_s"] = time.perf_counter() - start
    summary = phase_summary(history)  # time per phase, with its MFU (and HFU: checkpointing is on) beside it
    for key in ("timing/step_s", "perf/tokens", "perf/tokens_per_s", "perf/tokens_per_s_per_gpu", "rollout/sync_s", "rollout/sync_gib",
                "rollout/sync_check_s", "rollout/generate_s"):
        summary[key.replace("/", "_")] = steady(history, key)
    result.update(summary=summary, memory=memory_table(history, plan), offload=offload_table(history, bandwidth),
                  engine_plan=engine_plan, engine_measured=measured_terms(history), history=history)
    return result


def print_result(result: dict[str, Any]) -> None:
    name = f"{result['size']}" + (f" LoRA r{result['lora_rank']}" if result["lora_rank"] else "")
    if "skipped" in result:
        print(f"\n{name}: skipped: {result['skipped']}")
        return
    print(f"\n{name}: steady state (mean of steps 2..N), run {result['run_s']:.0f} s, model folder {result['build_s']:.0f} s")
    for key, value in result["summary"].items():
        print(f"  {key.ljust(28)}{value:12.3f}")
    print("  memory per GPU (GiB)     estimate  measured peak  ratio  end of phase")
    for m in result["memory"]:
        flag = "" if m["within_tolerance"] is None else (" ok" if m["within_tolerance"] else " OFF")
        estimate = f"{m['estimate_gib']:.1f}" if m["estimate_gib"] is not None else "-"
        print(f"  {m['phase'].ljust(22)}{estimate:>10}{m['measured_peak_gib']:15.1f}{m['ratio']:7.2f}{flag:4}"
              f"{m['end_gib']:12.1f}")
    print_comparison(result.get("engine_plan", {}), result.get("engine_measured", {}))
    bandwidth = result.get("bandwidth")
    print_offload_table(result["offload"], Bandwidth(**bandwidth) if bandwidth else None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="7B", help=f"comma-separated, of {list(SHAPES)}")
    parser.add_argument("--lora-rank", type=int, default=0, help="> 0: LoRA adapters of this rank (actor_rollout_ref.model.lora_rank)")
    parser.add_argument("--layers", type=int, default=None, help="cut each size to its first N decoder layers")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--response-length", type=int, default=512)
    parser.add_argument("--micro-rows", type=int, default=8, help="rows per update / log-prob micro-batch")
    parser.add_argument("--strategy", choices=sorted(STRATEGY_OVERRIDES), default="fsdp",
                        help="the training backend (megatron: its layout from overrides, e.g. "
                             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2)")
    parser.add_argument("--token-budget", type=int, default=0,
                        help="> 0: tokens per update micro-batch (use_dynamic_bsz; log-prob passes twice it) instead of --micro-rows")
    parser.add_argument("--log-prob-budget", type=int, default=0,
                        help="with --token-budget: the log-prob passes' token budget (default twice it); a step's rows "
                             "per GPU in one micro-batch make the plan's log-prob rows meet the budget they count")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (default: graphs on a GPU)")
    parser.add_argument("--force", action="store_true", help="run a size whose memory plan does not fit (trainer.memory_check=warn)")
    parser.add_argument("--workdir", default="/tmp/scale_step")
    parser.add_argument("--out", default="results/scale_step.json")
    return parser


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; valid: {list(SHAPES)}")
    bandwidth = probe_in_subprocess()  # before any size: the GPU and the host are idle
    results = []
    for size in sizes:
        results.append(run_size(size, args, extra, bandwidth))
        results[-1]["bandwidth"] = asdict(bandwidth) if bandwidth else None
        write(args, extra, results)  # after each size, so a later failure keeps what was measured
    print(f"\n{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")
    for result in results:
        print_result(result)
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
