"""Bytes of a LoRA weight sync (the adapter) against a full one, for Qwen2 shapes, from the shapes alone.

    python -m benchmarks.lora_sync_bytes [--sizes 0.5B,1.5B,7B] [--ranks 8,16,32,64] [--target-modules all-linear]
                                         [--out outputs/bench/lora_sync_bytes.json]

Each model is built on the meta device (no memory, no download) and planned by the code a sync runs: the
adapter is injected by `add_lora_adapters` (the FSDP actor's own call), and both layouts come from
`plan_model_buckets` — all parameters for a full sync, `adapter_parameter_names` for a LoRA one — in bf16,
the engine's dtype on GPU. `payload_bytes` is what `rollout/sync_bytes` reports.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from benchmarks.weight_sync import QWEN2
from workers.lora.model import adapter_parameter_names, add_lora_adapters
from workers.lora.spec import LoraSpec
from workers.rollout.buckets import payload_bytes
from workers.rollout.weight_sync import plan_model_buckets

BUCKET_BYTES = 512 << 20  # rollout.weight_sync_bucket_mb default
DTYPE = torch.bfloat16


def meta_model(size: str) -> Qwen2ForCausalLM:
    hidden, inter, layers, heads, kv_heads, head_dim, vocab, tied = QWEN2[size]
    config = Qwen2Config(
        hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab, tie_word_embeddings=tied,
    )
    with torch.device("meta"):
        return Qwen2ForCausalLM(config)


def sync_bytes(size: str, rank: int, target_modules: str | tuple[str, ...]) -> dict[str, float]:
    full = payload_bytes(plan_model_buckets(meta_model(size), DTYPE, BUCKET_BYTES))
    model = meta_model(size)
    add_lora_adapters(model, LoraSpec(rank=rank, alpha=2.0 * rank, target_modules=target_modules, exclude_modules=None))
    names = adapter_parameter_names(model)
    adapter = payload_bytes(plan_model_buckets(model, DTYPE, BUCKET_BYTES, names))
    return {
        "size": size, "rank": rank, "adapter_tensors": len(names), "adapter_params": adapter // DTYPE.itemsize,
        "adapter_bytes": adapter, "full_bytes": full, "adapter_percent": 100.0 * adapter / full,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.5B,1.5B,7B")
    parser.add_argument("--ranks", default="8,16,32,64")
    parser.add_argument("--target-modules", default="all-linear", help="'all-linear' or a comma list of module names")
    parser.add_argument("--out", default="outputs/bench/lora_sync_bytes.json")
    args = parser.parse_args()
    targets = args.target_modules if args.target_modules == "all-linear" else tuple(args.target_modules.split(","))
    rows = [sync_bytes(size, int(rank), targets) for size in args.sizes.split(",") for rank in args.ranks.split(",")]
    print(f"{'size':>5} {'rank':>4} {'adapter params':>15} {'adapter MiB':>12} {'full MiB':>10} {'adapter/full':>12}")
    for row in rows:
        print(f"{row['size']:>5} {row['rank']:>4} {row['adapter_params']:>15,} {row['adapter_bytes'] / 2**20:>12.1f} "
              f"{row['full_bytes'] / 2**20:>10.1f} {row['adapter_percent']:>11.2f}%")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"dtype": str(DTYPE), "target_modules": targets, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
