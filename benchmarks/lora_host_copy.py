"""vLLM's host copy of a mixture of experts' LoRA adapter, device -> host: one copy per factor (commit 7864ea7),
packed 128 MiB chunks into pageable memory (commit 1ab8afe), packed chunks into page-locked memory from PyTorch's
caching host allocator (workers/lora/host_copies.py, now).

    python -m benchmarks.lora_host_copy [--layers 48] [--experts 128] [--rank 16] [--repeats 5] [--chunk-mib 128]
        [--out outputs/bench/lora_host_copy.json]

The factors are separate bf16 tensors on the GPU, the experts' of Qwen3-30B-A3B (hidden 2048, expert width 768)
at rank r, per layer and expert: gate_proj and up_proj A [r, 2048], B [768, r]; down_proj A [r, 768], B [2048, r]
(LoRA's A is [r, in], B [out, r]). At the defaults: 48 x 128 x 3 x 2 = 36 864 tensors, 1.55 GiB (vLLM's adapter
at r16 on every linear layer also holds attention's factors: 1.86 GiB in all). Every variant also sums |w| as the
sync does (the sync check's fingerprint, read back once at the end; per factor for the per-factor copy, as
7864ea7 summed). Each repeat first frees the previous repeat's host copies, as a sync frees the previous
adapter's before copying the next. Per variant: seconds of the first repeat (fresh host memory; the pinned
variant's page-locking, unless an earlier run in the process left blocks cached), the mean of the others, GB/s
of that mean, and how many pinned blocks the caching host allocator created in the first repeat and in the others
(0 in the others: the chunks are reused). The last repeat's copies are compared with the factors, bit for bit.
Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from workers.lora.host_copies import CHUNK_BYTES, host_copies
from workers.rollout.verify import WeightFingerprint

GB = 1e9
HIDDEN, EXPERT_WIDTH = 2048, 768  # Qwen3-30B-A3B
Copy = Callable[[Sequence[torch.Tensor], WeightFingerprint, int], list[torch.Tensor]]


def factor_shapes(layers: int, experts: int, rank: int) -> list[tuple[int, int]]:
    """The experts' LoRA factor shapes in the order vLLM lists them: per layer and projection, every expert's A,
    then every expert's B."""
    projections = [(HIDDEN, EXPERT_WIDTH), (HIDDEN, EXPERT_WIDTH), (EXPERT_WIDTH, HIDDEN)]  # (in, out): gate, up, down
    shapes: list[tuple[int, int]] = []
    for _ in range(layers):
        for inputs, outputs in projections:
            shapes += [(rank, inputs)] * experts + [(outputs, rank)] * experts
    return shapes


def per_factor(tensors: Sequence[torch.Tensor], fingerprint: WeightFingerprint, chunk_bytes: int) -> list[torch.Tensor]:
    """7864ea7: every factor summed, then copied to pageable host memory one at a time."""
    fingerprint.add(tensors)
    return [tensor.to("cpu") for tensor in tensors]


def pageable_chunks(
    tensors: Sequence[torch.Tensor], fingerprint: WeightFingerprint, chunk_bytes: int
) -> list[torch.Tensor]:
    """1ab8afe: packed into chunks of at most `chunk_bytes` (one dtype here), each summed and copied with
    `.to("cpu")` into fresh pageable host memory."""
    copies: list[torch.Tensor] = []
    start = 0
    while start < len(tensors):
        end, size = start, 0
        while end < len(tensors) and (end == start or size + tensors[end].nbytes <= chunk_bytes):
            size += tensors[end].nbytes
            end += 1
        chunk = tensors[start:end]
        packed = torch.cat([tensor.reshape(-1) for tensor in chunk])
        fingerprint.add([packed])
        on_host = packed.to("cpu")
        del packed
        copies += [part.view(t.shape) for t, part in zip(chunk, on_host.split([t.numel() for t in chunk]))]
        start = end
    return copies


VARIANTS: dict[str, Copy] = {
    "per_factor": per_factor,
    "pageable_chunks": pageable_chunks,
    "pinned_chunks": host_copies,  # the code vLLM's sync runs
}


def _pinned_blocks_created() -> int:
    return int(torch.cuda.host_memory_stats().get("num_host_alloc", 0))


def measure(name: str, tensors: Sequence[torch.Tensor], reference: torch.Tensor, repeats: int,
            chunk_bytes: int) -> dict[str, Any]:
    copy = VARIANTS[name]
    seconds, blocks, values = [], [], []
    copies: list[torch.Tensor] = []
    for _ in range(repeats):
        copies = []  # the previous copy freed first, as a sync frees the previous adapter's
        torch.cuda.synchronize()
        created = _pinned_blocks_created()
        start = time.perf_counter()
        fingerprint = WeightFingerprint()
        copies = copy(tensors, fingerprint, chunk_bytes)
        values.append(fingerprint.value)  # read back: waits for the device
        seconds.append(time.perf_counter() - start)
        blocks.append(_pinned_blocks_created() - created)
    exact = torch.equal(torch.cat([part.reshape(-1) for part in copies]), reference)
    steady = statistics.mean(seconds[1:])
    nbytes = reference.nbytes
    return {
        "variant": name, "first_s": seconds[0], "steady_s": steady, "steady_gbps": nbytes / steady / GB,
        "seconds": seconds, "pinned_blocks_first": blocks[0], "pinned_blocks_steady": sum(blocks[1:]),
        "copies_pinned": bool(copies) and copies[0].is_pinned(), "bit_exact": exact, "fingerprint": values[-1],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| variant | first repeat s | steady mean s | GB/s (steady) | pinned blocks created (first / after) |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['variant']} | {row['first_s']:.3f} | {row['steady_s']:.3f} | {row['steady_gbps']:.1f} | "
                     f"{row['pinned_blocks_first']} / {row['pinned_blocks_steady']} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cuda", torch.cuda.current_device())
    shapes = factor_shapes(args.layers, args.experts, args.rank)
    generator = torch.Generator(device).manual_seed(0)
    tensors = [torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16) * 0.01
               for shape in shapes]
    reference = torch.cat([tensor.reshape(-1) for tensor in tensors]).cpu()
    rows = [measure(name, tensors, reference, args.repeats, args.chunk_mib * 2**20) for name in args.variants]
    fingerprints = [row["fingerprint"] for row in rows]
    return {
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__, "tensors": len(tensors),
        "bytes": reference.nbytes, "shapes": sorted(set(shapes)),
        "fingerprints_agree": max(fingerprints) - min(fingerprints) <= 1e-9 * max(fingerprints), "rows": rows,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5, help="the first, then the steady ones (at least 2)")
    parser.add_argument("--chunk-mib", type=int, default=CHUNK_BYTES // 2**20)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    args.variants = [name for name in args.variants.split(",") if name]
    if unknown := [name for name in args.variants if name not in VARIANTS]:
        parser.error(f"unknown --variants {unknown}: choose from {list(VARIANTS)}")
    if args.repeats < 2:
        parser.error(f"--repeats must be >= 2 (the first repeat, then the steady ones), got {args.repeats}")
    if min(args.layers, args.experts, args.rank, args.chunk_mib) < 1:
        parser.error("--layers, --experts, --rank and --chunk-mib must be >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.lora_host_copy needs a GPU: it times device->host copies from CUDA memory, "
                         "and torch.cuda.is_available() is False here")
    result = run(args)
    print(f"{result['device']}, torch {result['torch']}: {result['tensors']} bf16 factors, "
          f"{result['bytes'] / 2**30:.2f} GiB, {args.repeats} repeats, chunks of {args.chunk_mib} MiB")
    print(table(result["rows"]))
    exact = all(row["bit_exact"] for row in result["rows"])
    print(f"copies bit-exact: {exact}; fingerprints agree: {result['fingerprints_agree']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {**vars(args), "out": str(args.out)}, **result}, indent=1))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
