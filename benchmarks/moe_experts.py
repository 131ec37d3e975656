"""One Qwen3-MoE sparse MLP block (router + experts) forward and backward at a real model's shape, under each of
transformers' experts implementations, on one GPU in bf16: the grouped path the workers run (`grouped_mm`: one
grouped matrix multiply per projection), `batched_mm`, and `eager` (a Python loop over the experts) as the
baseline measured in the same run.

    python -m benchmarks.moe_experts [--shape qwen3-30b-a3b] [--tokens 16384] [--repeats 5] [--out f.json]

Per implementation: milliseconds per forward + backward (median), TFLOP/s counted by active parameters
(6 x tokens x (top-k experts' 3 projections + the router)), the share of the GPU's dense bf16 peak, and the
allocator's peak. `--shape tiny --device cpu` checks the script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from trainer.perf_metrics import peak_tflops_for

IMPLEMENTATIONS = ("grouped_mm", "batched_mm", "eager")
# (hidden, experts, expert width, active experts) of the MoE layers of Qwen3's mixtures, and a tiny one.
SHAPES = {
    "qwen3-30b-a3b": (2048, 128, 768, 8),
    "qwen3-235b-a22b": (4096, 128, 1536, 8),
    "tiny": (128, 8, 64, 2),
}


@dataclass
class Row:
    implementation: str
    ms: float | None  # None: the implementation ran out of memory at this size (`error` says so)
    tflops: float | None
    peak_fraction: float | None
    peak_gib: float | None
    max_diff_vs_eager: float | None  # the largest output difference from the eager loop, over the output's scale
    error: str | None = None


def moe_block(shape: str, device: torch.device, dtype: torch.dtype) -> Qwen3MoeSparseMoeBlock:
    hidden, experts, width, active = SHAPES[shape]
    config = Qwen3MoeConfig(
        hidden_size=hidden, num_experts=experts, moe_intermediate_size=width, num_experts_per_tok=active,
        norm_topk_prob=True,
    )
    block = Qwen3MoeSparseMoeBlock(config).to(device=device, dtype=dtype)
    for parameter in block.parameters():  # random weights of a trained model's scale, not the zeros of meta init
        torch.nn.init.normal_(parameter, std=0.02)
    return block


def active_flops(shape: str, tokens: int) -> float:
    """Forward + backward FLOPs of the block by active parameters (backward counted as twice the forward)."""
    hidden, experts, width, active = SHAPES[shape]
    per_token = active * 3 * hidden * width + hidden * experts
    return 6.0 * tokens * per_token


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_block(block: Qwen3MoeSparseMoeBlock, implementation: str, tokens: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one forward + backward over `tokens` tokens, and the allocator's peak in GiB."""
    device = next(block.parameters()).device
    block.experts.config._experts_implementation = implementation
    inputs = torch.randn(1, tokens, block.experts.hidden_dim, device=device, dtype=next(block.parameters()).dtype)
    inputs.requires_grad_(True)
    seconds = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for index in range(repeats + 1):  # the first pass warms up (kernel choice, allocator)
        _sync(device)
        started = time.perf_counter()
        output = block(inputs)
        output.float().pow(2).mean().backward()
        _sync(device)
        if index:
            seconds.append(time.perf_counter() - started)
        block.zero_grad(set_to_none=True)
        inputs.grad = None
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return statistics.median(seconds), peak


@torch.no_grad()
def output_of(block: Qwen3MoeSparseMoeBlock, implementation: str, inputs: torch.Tensor) -> torch.Tensor:
    block.experts.config._experts_implementation = implementation
    return block(inputs).float()


def measure(shape: str, tokens: int, repeats: int, device: torch.device) -> list[Row]:
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    block = moe_block(shape, device, dtype)
    peak_tflops = peak_tflops_for(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    probe = torch.randn(1, min(tokens, 1024), SHAPES[shape][0], device=device, dtype=dtype)
    reference = output_of(block, "eager", probe)
    rows = []
    for implementation in IMPLEMENTATIONS:
        try:
            difference = (output_of(block, implementation, probe) - reference).abs().max() / reference.abs().max()
            seconds, peak_gib = time_block(block, implementation, tokens, repeats)
        except torch.OutOfMemoryError as error:  # batched_mm gathers every token's expert weights
            rows.append(Row(implementation, None, None, None, None, None, f"out of memory: {str(error)[:120]}"))
            block.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            continue
        tflops = active_flops(shape, tokens) / seconds / 1e12
        share = tflops / peak_tflops if peak_tflops else None
        rows.append(Row(implementation, seconds * 1e3, tflops, share, peak_gib, float(difference)))
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| experts implementation | ms fwd+bwd | TFLOP/s (active) | of dense bf16 peak | peak GiB | vs eager |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        if row.ms is None:
            lines.append(f"| {row.implementation} | {row.error} | | | | |")
            continue
        share = f"{row.peak_fraction:.1%}" if row.peak_fraction is not None else "-"
        lines.append(
            f"| {row.implementation} | {row.ms:.2f} | {row.tflops:.1f} | {share} | {row.peak_gib:.2f} | "
            f"{row.max_diff_vs_eager:.1e} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = measure(args.shape, args.tokens, args.repeats, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{args.shape}, {args.tokens} tokens, {device} ({name})")
    print(table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"shape": args.shape, "tokens": args.tokens, "device": str(device), "torch": torch.__version__,
                  "rows": [asdict(row) for row in rows]}
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
