"""Where one PPO update's time goes, on one GPU: the actor update as the workers run it (`FSDPBackend` +
`run_ppo_updates`, packed rows, token-budget micro-batches, one optimizer step, GRPO's loss with the KL term) over
a GRPO-sized batch, timed and MFU-counted per configuration; one configuration also under torch.profiler, its
GPU time split by kind (matmul, attention, optimizer, collectives, copies, the rest) and the host's allocator
and synchronisation calls counted.

    python -m benchmarks.update_profile [--shape 7B] [--layers 14] [--rows 128] [--max-prompt 512]
        [--max-response 1024] [--variants 16384/all/micro,16384/all/phase,...] [--profile 16384/all/micro]
        [--lora-rank 16 [--lora-targets q_proj,k_proj,v_proj,o_proj,gate]] [--repeats 2]
        [--out outputs/bench/update_profile.json]

A variant is `<tokens per micro-batch>/<recompute>/<release>`: recompute `all` (gradient checkpointing on every
decoder layer), `none` (off), or N (the first N layers recompute, the rest keep their activations:
model.gradient_checkpointing_layers); release `micro` or `phase` (trainer.release_cached_blocks). `--layers`
cuts the shape's decoder layers so that one GPU holds what FSDP over two GPUs holds per GPU (14 of the 7B's 28:
float32 weights, gradients and Adam state of ~4.4 B parameters): every layer is the real layer, so the kernels
and the per-token work are those of the full model. MFU counts the model's FLOPs (trainer/flops.py) over the
update's wall time and the device's bf16 peak; HFU adds the recomputed forward. Random-init Qwen2 weights written
here (benchmarks/random_model.py); needs a CUDA GPU, except `--shape tiny` / `tiny-moe` which check the script
on CPU. `--shape 30B-A3B` is Qwen3-30B-A3B's mixture of experts (MFU counted by active parameters; the kernels of
its experts' routing are a kind of their own in the profile); `--lora-rank` trains a LoRA adapter on the frozen base
(`--lora-targets`: the modules, default every linear layer, the fused experts included).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForCausalLM

from benchmarks.model_shapes import QWEN2_0_5B, QWEN2_7B, QWEN2_14B, QWEN3_30B_A3B
from benchmarks.packing import Phase, free_device_memory, rollout_batch
from benchmarks.random_model import write_model_folder
from protocol import DataProto
from trainer.flops import ModelFlops
from trainer.memory_plan.shape import read_shape
from trainer.perf_metrics import peak_tflops_for
from workers.cached_blocks import release_point_during
from workers.cached_blocks_limit import AFTER_MICRO_BATCH, AFTER_PHASE
from workers.config import actor_rollout_ref_config
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.model_loading import worker_device
from workers.packing.attention import kernel_name
from workers.training.actor_loss import actor_forward, actor_loss
from workers.training.dist_utils import single_process_group
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates

SHAPES = {
    "7B": QWEN2_7B,
    "14B": QWEN2_14B,
    "tiny": dict(QWEN2_0_5B, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=384, vocab_size=1024, tie_word_embeddings=False),
    "30B-A3B": QWEN3_30B_A3B,
    "tiny-moe": dict(QWEN3_30B_A3B, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, intermediate_size=384, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                     vocab_size=1024),
}
CPU_SHAPES = ("tiny", "tiny-moe")
RELEASES = {"micro": AFTER_MICRO_BATCH, "phase": AFTER_PHASE}
# GPU kernels by name, first match wins (Hopper's cuBLAS kernels are nvjet_* / sm90_xmma_*).
KERNEL_KINDS = (
    ("collectives", ("nccl",)),
    ("attention", ("flash", "fmha", "attention")),
    ("optimizer", ("adam", "multi_tensor_apply")),
    # Gathers, scatters, sorts and scans: in a mixture of experts, its routing (top-k, the sort that groups tokens
    # by expert, their permutation and the weighted sum back); in a dense model, little beyond the embedding.
    ("routing", ("topk", "sort", "scatter", "gather", "index", "histc", "bincount", "cumsum", "scan")),
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "splitk")),
    ("copies", ("memcpy", "memset", "copy")),
)
HOST_CALLS = ("cudaMalloc", "cudaFree", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpyAsync", "cudaLaunchKernel")


@dataclass(frozen=True)
class Variant:
    budget: int
    recompute: str  # "all", "none" or a number of layers
    release: str  # "micro" or "phase"

    @classmethod
    def parse(cls, text: str, layers: int) -> "Variant":
        try:
            budget, recompute, release = text.split("/")
            variant = cls(int(budget), recompute, release)
        except ValueError:
            raise ValueError(f"variant {text!r}: write <tokens>/<all|none|N>/<micro|phase>, e.g. 16384/all/micro")
        if variant.release not in RELEASES:
            raise ValueError(f"variant {text!r}: release {release!r} is not one of {list(RELEASES)}")
        if recompute not in ("all", "none") and not (recompute.isdigit() and 0 < int(recompute) <= layers):
            raise ValueError(f"variant {text!r}: recompute {recompute!r} is not all, none or 1..{layers}")
        return variant

    @property
    def name(self) -> str:
        return f"{self.budget}/{self.recompute}/{self.release}"

    def recompute_share(self, layers: int) -> float:
        if self.recompute in ("all", "none"):
            return 1.0 if self.recompute == "all" else 0.0
        return int(self.recompute) / layers

    def actor_config(self, model_dir: str, rows: int, lora: dict[str, Any] | None = None) -> dict[str, Any]:
        return actor_rollout_ref_config({
            "model": {
                "path": model_dir, "use_remove_padding": True,
                "enable_gradient_checkpointing": self.recompute != "none",
                "gradient_checkpointing_layers": int(self.recompute) if self.recompute.isdigit() else None,
                **(lora or {}),
            },
            "actor": {
                "optim": {"lr": 1e-6}, "ppo_mini_batch_size": rows, "use_dynamic_bsz": True,
                "ppo_max_token_len_per_gpu": self.budget, "loss_agg_mode": "token-mean", "shuffle": False,
                "use_kl_loss": True, "kl_loss_type": "low_var_kl", "entropy_coeff": 0.0,
            },
        })


def grpo_batch(rows: int, max_prompt: int, max_response: int, vocab: int, seed: int) -> DataProto:
    """Prompts uniform in [max_prompt/2, max_prompt], responses uniform in [max_response/4, max_response] (the 7B
    GRPO comparison's rows average ~1 090 tokens at 512 + 1024), random tokens, advantages and reference
    log-probs."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(max_prompt // 2, max_prompt + 1, (rows,), generator=generator).tolist()
    responses = torch.randint(max(1, max_response // 4), max_response + 1, (rows,), generator=generator).tolist()
    data = rollout_batch(prompts, responses, vocab, seed)
    response_shape = data.batch["responses"].shape
    data.batch["ref_log_prob"] = -torch.rand(response_shape, generator=generator) * 3
    return data


def update(backend: FSDPBackend, data: DataProto, actor_cfg: dict[str, Any]) -> dict[str, float]:
    schedule = PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0)
    return run_ppo_updates(
        backend, data, actor_forward(actor_cfg, 1.0), lambda out, micro: actor_loss(out, micro, actor_cfg), schedule,
        "update_actor",
    )


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, parts in KERNEL_KINDS if any(part in lowered for part in parts)), "other")


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds in, seconds out)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def trace_breakdown(prof: profile, wall_s: float) -> dict[str, Any]:
    """GPU time by kernel kind (summed over kernels: streams may overlap), the union of all kernels' time
    against the wall time (the rest: the GPU waited for the host), and the host's CUDA runtime calls."""
    by_kind: dict[str, float] = defaultdict(float)
    top: Counter[str] = Counter()
    intervals: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    host_calls: dict[str, dict[str, float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            start, end = event.time_range.start, event.time_range.end
            kind = kernel_kind(event.name)
            by_kind[kind] += (end - start) / 1e6
            top[event.name[:90]] += (end - start) / 1e6
            intervals.append((start, end))
            if kind == "collectives":
                comm.append((start, end))
        elif event.name in HOST_CALLS:
            call = host_calls.setdefault(event.name, {"count": 0, "seconds": 0.0})
            call["count"] += 1
            call["seconds"] += (event.time_range.end - event.time_range.start) / 1e6
    ops = sorted(prof.key_averages(), key=lambda op: -op.self_device_time_total)[:25]
    gpu_busy = busy_seconds(intervals)
    comm_set = set(comm)
    compute_busy = busy_seconds([i for i in intervals if i not in comm_set]) if comm else gpu_busy
    return {
        "wall_s": wall_s,
        "gpu_busy_s": gpu_busy,
        "gpu_idle_share": max(0.0, 1 - gpu_busy / wall_s),
        "kernel_s_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        # Collective time not hidden behind compute: the union minus compute's union.
        "exposed_collective_s": gpu_busy - compute_busy,
        "top_kernels_s": dict(top.most_common(15)),
        # Device time by the operator that launched it (self time: not its children's), with its call count.
        "top_ops_s": {op.key: [op.self_device_time_total / 1e6, op.count] for op in ops},
        "host_calls": host_calls,
    }


def run_variant(
    variant: Variant, model_dir: str, data: DataProto, warmup: DataProto, args: argparse.Namespace, flops: ModelFlops
) -> dict[str, Any]:
    device = worker_device()
    config = variant.actor_config(model_dir, len(data), lora_settings(args))
    row: dict[str, Any] = {"variant": variant.name}
    backend = None
    try:
        backend = FSDPBackend(AutoModelForCausalLM, config["model"], 0, optim_cfg=config["actor"]["optim"])
        update(backend, warmup.select(deepcopy=True), config["actor"])
        row["trainable_parameters"] = sum(p.numel() for p in backend.module.parameters() if p.requires_grad)
        lengths = data.batch["attention_mask"].sum(-1).tolist()
        model_flops = flops.train(lengths).total
        hardware_flops = model_flops + flops.recompute(lengths).total * variant.recompute_share(flops.shape.layers)
        peak = peak_tflops_for(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        seconds = []
        for _ in range(args.repeats):
            before = torch.cuda.memory_stats(device) if device.type == "cuda" else {}
            with Phase(device) as phase:
                metrics = update(backend, data.select(deepcopy=True), config["actor"])
            seconds.append(phase.seconds)
        after = torch.cuda.memory_stats(device) if device.type == "cuda" else {}
        update_s = sum(seconds) / len(seconds)
        row.update(
            update_s=update_s, update_s_each=seconds, peak_allocated_gib=phase.peak_gib,
            peak_reserved_gib=phase.peak_reserved_gib,
            reserved_gib=torch.cuda.memory_reserved(device) / 2**30 if device.type == "cuda" else None,
            device_allocs=after.get("num_device_alloc", 0) - before.get("num_device_alloc", 0),
            alloc_retries=after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0),
            cached_block_releases=metrics.get("cached_block_releases"), pg_loss=metrics.get("pg_loss"),
            tokens=int(sum(lengths)), tokens_per_s=sum(lengths) / update_s,
            mfu=model_flops / (update_s * peak * 1e12) if peak else None,
            hfu=hardware_flops / (update_s * peak * 1e12) if peak else None,
        )
        if variant.name in args.profile:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=activities) as prof, Phase(device) as phase:
                update(backend, data.select(deepcopy=True), config["actor"])
            row["profile"] = trace_breakdown(prof, phase.seconds)
    except torch.cuda.OutOfMemoryError as error:
        row["error"] = f"out of memory: {str(error).splitlines()[0]}"
    finally:
        del backend
        free_device_memory(device)
    return row


def lora_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The model keys of `--lora-rank` / `--lora-targets` (none: a full fine-tune)."""
    if not args.lora_rank:
        return {}
    targets = args.lora_targets.split(",") if args.lora_targets != "all-linear" else "all-linear"
    return {"lora_rank": args.lora_rank, "lora_alpha": 2 * args.lora_rank, "target_modules": targets}


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| variant (budget/recompute/release) | update s | MFU | HFU | tokens/s | peak alloc GiB | peak reserved GiB "
          "| device allocs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} |")
            continue
        pct = lambda v: f"{100 * v:.1f}%" if v is not None else "n/a"  # noqa: E731
        print(f"| {r['variant']} | {r['update_s']:.2f} | {pct(r['mfu'])} | {pct(r['hfu'])} | {r['tokens_per_s']:.0f} | "
              f"{r['peak_allocated_gib'] or 0:.1f} | {r['peak_reserved_gib'] or 0:.1f} | {r['device_allocs']} |")
    for r in rows:
        if "profile" in r:
            print(f"profile of {r['variant']}:", json.dumps(r["profile"], indent=1))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="7B" if on_gpu else "tiny", choices=list(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 14 for 7B, else all)")
    parser.add_argument("--rows", type=int, default=128 if on_gpu else 8)
    parser.add_argument("--max-prompt", type=int, default=512 if on_gpu else 32)
    parser.add_argument("--max-response", type=int, default=1024 if on_gpu else 64)
    default_variants = "16384/all/micro,16384/all/phase" if on_gpu else "256/all/micro,256/2/phase"
    parser.add_argument("--variants", default=default_variants)
    parser.add_argument("--profile", default="", help="comma-separated variants to run once more under torch.profiler")
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per variant (after one warm-up)")
    parser.add_argument("--liger", action="store_true",
                        help="Liger's Triton kernels for Qwen2's RMSNorm, SwiGLU and rotary embedding (liger-kernel)")
    parser.add_argument("--lora-rank", type=int, default=0, help="train a LoRA adapter of this rank (0: full fine-tune)")
    parser.add_argument("--lora-targets", default="all-linear",
                        help="comma-separated modules LoRA adapts (default all-linear: every linear layer, experts too)")
    parser.add_argument("--workdir", default=None, help="model folder's parent (default: a temporary folder)")
    parser.add_argument("--out", default="outputs/bench/update_profile.json")
    args = parser.parse_args(argv)
    if not on_gpu and args.shape not in CPU_SHAPES:
        parser.error(f"--shape {args.shape} needs a CUDA GPU; on CPU use one of {list(CPU_SHAPES)}")
    if args.liger and SHAPES[args.shape].get("model_type", "qwen2") != "qwen2":
        parser.error(f"--liger patches Qwen2 only; --shape {args.shape} is {SHAPES[args.shape]['model_type']}")
    shape = dict(SHAPES[args.shape])
    shape["num_hidden_layers"] = args.layers or (14 if args.shape == "7B" else shape["num_hidden_layers"])
    try:
        variants = [Variant.parse(text, shape["num_hidden_layers"]) for text in args.variants.split(",")]
    except ValueError as error:
        parser.error(str(error))
    args.profile = [text for text in args.profile.split(",") if text]
    unknown = [text for text in args.profile if text not in [v.name for v in variants]]
    if unknown:
        parser.error(f"--profile {unknown} not among --variants {[v.name for v in variants]}")
    longest = args.max_prompt + args.max_response
    if any(v.budget < longest for v in variants):
        parser.error(f"every variant's budget must hold one whole sequence ({longest} tokens)")
    if args.liger:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2

        apply_liger_kernel_to_qwen2(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=False)
    device = worker_device()
    with single_process_group(device), tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        model_dir = str(Path(workdir) / args.shape)
        write_model_folder(model_dir, shape)
        flops = ModelFlops(read_shape(model_dir, "model"))
        data = grpo_batch(args.rows, args.max_prompt, args.max_response, shape["vocab_size"], seed=1)
        warmup = grpo_batch(max(2, args.rows // 8), args.max_prompt, args.max_response, shape["vocab_size"], seed=2)
        report = {
            "command": "python -m benchmarks.update_profile " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
            "torch": torch.__version__,
            "attention_kernel": kernel_name(device, torch.bfloat16 if on_gpu else torch.float32),
            "shape": shape,
            "settings": vars(args),
            "rows": [],
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        for variant in variants:  # written after each variant: a run cut short keeps what it measured
            with release_point_during(RELEASES[variant.release]):  # main() may run inside a test's process
                report["rows"].append(run_variant(variant, model_dir, data, warmup, args, flops))
            Path(args.out).write_text(json.dumps(report, indent=2))
    print_table(report["rows"])
    return report


if __name__ == "__main__":
    main()
