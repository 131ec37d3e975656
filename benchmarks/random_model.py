"""A random-init Qwen2 or Qwen3-MoE model folder of any size, written fast and without the model in host memory.

    python -m benchmarks.random_model OUT_DIR --shape '{"hidden_size": 3584, ...}' [--seed 0] [--shard-gib 4]
        [--writers N]

The shape's `model_type` picks the architecture (default `qwen2`; `qwen3_moe` for a mixture of experts). The
parameters' names and shapes come from the model built on the meta device (no memory), under the names a
checkpoint holds (a mixture of experts' fused expert tensors as per-expert ones, which vLLM's loader reads); each
tensor is drawn (normal(0, initializer_range) for matrices, ones for norms, zeros for biases) in bf16 on the GPU when
there is one (a 7B model in seconds; on the host a single-threaded generator would take minutes) and written
shard by shard as safetensors with an index, so at most one shard per writer is in host memory. A 14B or 32B
folder (28 / 61 GiB) is bound by the copy to the host and the disk: `--writers N` (default: one per visible
GPU) writes the shards from N processes, each on its own GPU. Every shard draws from a generator seeded by
(seed, shard index), so the folder is the same for any number of writers. The tokenizer is the
project's character tokenizer (its vocabulary is smaller than any model vocabulary used here). Run it as a
subprocess (`write_model_folder`) so the GPU memory and CUDA context it used are gone before a benchmark
starts measuring.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _config(shape: dict, **special_tokens: int) -> Any:
    from transformers import AutoConfig

    fields = dict(shape)
    return AutoConfig.for_model(fields.pop("model_type", "qwen2"), **fields, **special_tokens, dtype="bfloat16")


def _meta_model(config: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def write_config(out_dir: str | Path, shape: dict) -> Any:
    """The folder's config.json and tokenizer (all a memory plan needs); returns the transformers config."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    if shape["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size={shape['vocab_size']} is smaller than the character tokenizer's {len(tokenizer)} tokens")
    # `architectures` names the model class: verl's workers (benchmarks/peers) refuse a folder without it.
    config = _config(shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                     bos_token_id=tokenizer.pad_token_id)
    config.architectures = [type(_meta_model(config)).__name__]
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return config


def _shard_file(index: int, count: int) -> str:
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def _model_specs(config: Any) -> list[tuple[str, torch.Size]]:
    from workers.rollout.checkpoint_names import CheckpointNames

    parameters = ((name, p.detach()) for name, p in _meta_model(config).named_parameters())  # tied: once
    return [(name, meta.shape) for name, meta in CheckpointNames(config)(parameters)]


def write_shards(out_dir: str | Path, config: Any, seed: int, shard_gib: float, writer: int, writers: int) -> None:
    """Write the shards `writer`, `writer + writers`, ... of the folder (1-based file numbers)."""
    out = Path(out_dir)
    shards = _shard_plan(_model_specs(config), int(shard_gib * (1 << 30)))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for i in range(writer, len(shards), writers):
        generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + i)
        tensors = {name: _draw(name, shape, config.initializer_range, device, generator) for name, shape in shards[i]}
        save_file(tensors, str(out / _shard_file(i + 1, len(shards))), metadata={"format": "pt"})


def _saved_config(out_dir: str | Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(out_dir)


def _writer_env(writer: int) -> dict[str, str]:
    env = dict(os.environ)
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    if visible:
        env["CUDA_VISIBLE_DEVICES"] = visible[writer % len(visible)]
    elif torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = str(writer % torch.cuda.device_count())
    return env


def write_random_model(
    out_dir: str | Path, shape: dict, seed: int = 0, shard_gib: float = 4.0, writers: int | None = None
) -> int:
    """Write config, tokenizer and sharded bf16 safetensors + index; returns the parameter count.
    `writers` processes (default: one per visible GPU, at least one) write the shards, each on its own GPU."""
    out = Path(out_dir)
    config = write_config(out, shape)
    specs = _model_specs(config)
    shards = _shard_plan(specs, int(shard_gib * (1 << 30)))
    writers = max(1, min(writers or torch.cuda.device_count(), len(shards)))
    if writers == 1:
        write_shards(out, config, seed, shard_gib, 0, 1)
    else:
        # Each writer rebuilds the same plan from the folder's config.json, so only numbers cross to it.
        children = [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.random_model", str(out), "--shape", json.dumps(shape),
                 "--seed", str(seed), "--shard-gib", str(shard_gib), "--writer", f"{w}/{writers}"],
                env=_writer_env(w), cwd=Path(__file__).resolve().parents[1], stderr=subprocess.PIPE, text=True,
            )
            for w in range(writers)
        ]
        failed = [(w, child.communicate()[1]) for w, child in enumerate(children)]
        failed = [(w, err) for (w, err), child in zip(failed, children) if child.returncode != 0]
        if failed:
            raise RuntimeError(f"shard writer {failed[0][0]} of {writers} failed:\n{failed[0][1][-4000:]}")
    weight_map = {name: _shard_file(i + 1, len(shards)) for i, shard in enumerate(shards) for name, _ in shard}
    total_bytes = sum(shape.numel() * DTYPE.itemsize for _, shape in specs)
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return sum(shape.numel() for _, shape in specs)


def write_model_folder(out_dir: str | Path, shape: dict, seed: int = 0) -> int:
    """`write_random_model` in a child process (its GPU memory is released when it exits); returns #params."""
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
    parser.add_argument("--shape", required=True, help="config fields as JSON (model_type: qwen2 or qwen3_moe)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-gib", type=float, default=4.0)
    parser.add_argument("--writers", type=int, default=None, help="processes writing shards (default: one per GPU)")
    parser.add_argument("--writer", default=None, help=argparse.SUPPRESS)  # "i/n": one writer's share (internal)
    args = parser.parse_args(argv)
    if args.writer:
        writer, writers = (int(part) for part in args.writer.split("/"))
        write_shards(args.out_dir, _saved_config(args.out_dir), args.seed, args.shard_gib, writer, writers)
        return
    print(write_random_model(args.out_dir, json.loads(args.shape), args.seed, args.shard_gib, args.writers))


if __name__ == "__main__":
    main()
