"""A random-init Qwen2 model folder of any size, written fast and without the model in host memory.

    python -m benchmarks.random_model OUT_DIR --shape '{"hidden_size": 3584, ...}' [--seed 0] [--shard-gib 4]

The parameters' names and shapes come from the model built on the meta device (no memory); each tensor is
drawn (normal(0, initializer_range) for matrices, ones for norms, zeros for biases) in bf16 on the GPU when
there is one (a 7B model in seconds; on the host a single-threaded generator would take minutes) and written
shard by shard as safetensors with an index, so at most one shard is in host memory. The tokenizer is the
project's character tokenizer (its vocabulary is smaller than any model vocabulary used here). Run it as a
subprocess (`write_model_folder`) so the GPU memory and CUDA context it used are gone before a benchmark
starts measuring.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainer.tiny_model import build_char_tokenizer

DTYPE = torch.bfloat16


def _shard_plan(specs: list[tuple[str, torch.Size]], shard_bytes: int) -> list[list[tuple[str, torch.Size]]]:
    shards: list[list[tuple[str, torch.Size]]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = shape.numel() * DTYPE.itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def _draw(name: str, shape: torch.Size, std: float, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=DTYPE)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=DTYPE)
    return torch.empty(shape, dtype=DTYPE, device=device).normal_(0.0, std, generator=generator).cpu()


def write_config(out_dir: str | Path, shape: dict) -> Any:
    """The folder's config.json and tokenizer (all a memory plan needs); returns the Qwen2Config."""
    from transformers import Qwen2Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    if shape["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size={shape['vocab_size']} is smaller than the character tokenizer's {len(tokenizer)} tokens")
    # `architectures` names the model class: verl's workers (benchmarks/peers) refuse a folder without it.
    config = Qwen2Config(**shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.pad_token_id, dtype="bfloat16", architectures=["Qwen2ForCausalLM"])
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return config


def write_random_qwen2(out_dir: str | Path, shape: dict, seed: int = 0, shard_gib: float = 4.0) -> int:
    """Write config, tokenizer and sharded bf16 safetensors + index; returns the parameter count."""
    from transformers import Qwen2ForCausalLM

    out = Path(out_dir)
    config = write_config(out, shape)
    with torch.device("meta"):
        meta = Qwen2ForCausalLM(config)
    specs = [(name, p.shape) for name, p in meta.named_parameters()]  # tied weights appear once
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator(device=device).manual_seed(seed)
    shards = _shard_plan(specs, int(shard_gib * (1 << 30)))
    weight_map: dict[str, str] = {}
    total_bytes = 0
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _draw(name, shape, config.initializer_range, device, generator) for name, shape in shard}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update((name, file) for name in tensors)
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return sum(shape.numel() for _, shape in specs)


def write_model_folder(out_dir: str | Path, shape: dict, seed: int = 0) -> int:
    """`write_random_qwen2` in a child process (its GPU memory is released when it exits); returns #params."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.random_model", str(out_dir), "--shape", json.dumps(shape), "--seed", str(seed)],
        capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1],
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the model folder {out_dir} failed:\n{done.stderr[-4000:]}")
    return int(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--shape", required=True, help="Qwen2Config fields as JSON")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-gib", type=float, default=4.0)
    args = parser.parse_args(argv)
    print(write_random_qwen2(args.out_dir, json.loads(args.shape), args.seed, args.shard_gib))


if __name__ == "__main__":
    main()
