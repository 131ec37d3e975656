"""The allocator's peak of the workers' packed log-prob forward (and a forward + backward) on one GPU, per token
of a micro-batch: full fine-tuning, LoRA and a frozen reference, with the big tensors the pass produced.

    python -m benchmarks.logprob_memory [--shape 0.5B] [--rows 8] [--prompt 96] [--response 8192] [--variants full,lora,frozen] [--json OUT]

A random-init Qwen2 of `--shape` (benchmarks/model_shapes.py) is written once to --workdir and loaded as the
workers load it (`load_sharded_model`: FSDP2 on one rank, bf16 compute, gradient checkpointing, packed
sequences, log-probs chunked over 2048 tokens). Per variant: `torch.cuda.max_memory_allocated` above what was
allocated before the pass (no-grad forward with entropy; then forward + backward for the trainable ones),
divided by the micro-batch's tokens, and every op output of at least 256 MiB (op, shape, dtype, count): a
[tokens x vocabulary] logits tensor would show there. The memory plan's per-token terms
(trainer/memory_plan/terms.py) are what these figures check. Needs a CUDA GPU (the CPU has no allocator peak).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.model_shapes import QWEN2_0_5B, QWEN2_1_5B, QWEN2_7B

SHAPES = {"0.5B": QWEN2_0_5B, "1.5B": QWEN2_1_5B, "7B": QWEN2_7B}
BIG_BYTES = 256 << 20


class BigOutputs(TorchDispatchMode):
    """Counts the ops whose outputs are at least `limit` bytes, by op, shape and dtype."""

    def __init__(self, limit: int = BIG_BYTES) -> None:
        super().__init__()
        self.limit = limit
        self.seen: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor) and tensor.numel() * tensor.element_size() >= self.limit:
                key = f"{func} {tuple(tensor.shape)} {tensor.dtype}"
                self.seen[key] = self.seen.get(key, 0) + 1
        return out


def micro_batch(rows: int, prompt: int, response: int) -> Any:
    from protocol import DataProto

    ids = torch.randint(10, 1000, (rows, prompt + response), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1,
        "responses": ids[:, prompt:], "response_mask": mask[:, prompt:],
    })


def measure(model: torch.nn.Module, micro: Any, device: torch.device, train: bool) -> tuple[int, dict[str, int]]:
    """(allocator peak above the bytes allocated before, big outputs) of one pass."""
    from workers.packing.forward import packed_response_log_probs_and_entropy

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    spy = BigOutputs()
    with spy, torch.set_grad_enabled(train):
        log_probs, entropy = packed_response_log_probs_and_entropy(model, micro, device, 1.0, with_entropy=True)
        if train:
            (log_probs.sum() - 0.01 * entropy.sum()).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, spy.seen



def variant_settings(lora_rank: int) -> dict[str, tuple[str, bool, Any]]:
    """--variants name -> (label, trainable, LoRA spec or None): the one list of the variants this measures."""
    from workers.lora.spec import LoraSpec

    lora = LoraSpec(lora_rank, 2.0 * lora_rank, "all-linear", None)
    return {"full": ("full", True, None), "lora": (f"lora r{lora_rank}", True, lora), "frozen": ("frozen", False, None)}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5B")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=96)
    parser.add_argument("--response", type=int, default=8192)
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--workdir", default="/tmp/logprob_memory")
    parser.add_argument("--json", default=None)
    valid = ", ".join(variant_settings(0))
    parser.add_argument("--variants", default=valid.replace(" ", ""), help=f"comma-separated, of {valid}")
    args = parser.parse_args(argv)
    settings = variant_settings(args.lora_rank)
    chosen = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(chosen) - set(settings))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; valid: {valid}")
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.logprob_memory needs a CUDA GPU: the CPU has no allocator peak to read")
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from benchmarks.random_model import write_model_folder
    from workers.fsdp.model_loading import load_sharded_model

    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    dist.init_process_group("nccl")
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    folder = Path(args.workdir) / args.shape
    if not (folder / "config.json").exists():
        write_model_folder(folder, SHAPES[args.shape])
    micro = micro_batch(args.rows, args.prompt, args.response)
    tokens = args.rows * (args.prompt + args.response)
    results = []
    for name, trainable, spec in (settings[v] for v in chosen):
        cfg = {"path": str(folder), "dtype": "bfloat16", "attn_implementation": None, "enable_gradient_checkpointing": True,
               "use_remove_padding": True, "logits_chunk_tokens": 2048}
        model = load_sharded_model(AutoModelForCausalLM, cfg, device, trainable, lora=spec)
        entry: dict[str, Any] = {"variant": name, "tokens": tokens}
        for kind in ("forward", "train") if trainable else ("forward",):
            peak, big = measure(model, micro, device, kind == "train")
            entry.update({f"{kind}_gib": peak / 2**30, f"{kind}_bytes_per_token": peak / tokens, f"{kind}_big_outputs": big})
        print(f"{name:10s} forward {entry['forward_gib']:6.2f} GiB ({entry['forward_bytes_per_token'] / 1024:6.1f} KiB/token)"
              + (f"   forward+backward {entry['train_gib']:6.2f} GiB ({entry['train_bytes_per_token'] / 1024:6.1f} KiB/token)" if trainable else ""))
        results.append(entry)
        del model
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "args": vars(args), "results": results}, indent=1))
    dist.destroy_process_group()
    return results


if __name__ == "__main__":
    main()
