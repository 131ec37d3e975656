"""GRPO steps on one GPU with a random-init Qwen2 of ~0.5B parameters (one worker, nccl, bf16).

    python -m benchmarks.gpu_grpo_step --workdir /tmp/gpu_run [--steps 3] [--out results/gpu_grpo_step.json]

Builds the model (Qwen2.5-0.5B shape) and the synthetic data locally, runs `trainer.main`'s GRPO loop and
prints the per-phase time of each step. The first step includes CUDA/NCCL warm-up; later steps show the
steady state.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.model_shapes import QWEN2_0_5B
from trainer.config_loader import load_config
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.main import run
from trainer.tiny_model import build_char_tokenizer


def build_model(out_dir: Path, shape: dict | None = None) -> int:
    """Write a random-init Qwen2 of `shape` (default the 0.5B one; bf16 safetensors) plus the local
    character tokenizer; returns #params."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(**(shape or QWEN2_0_5B), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def grpo_overrides(work: Path, train: Path, val: Path, steps: int, logger: str) -> list[str]:
    """The GPU GRPO benchmark setup (one worker, 16 prompts x 8 samples x 256 new tokens) for the model in
    `work/model`; shared with `benchmarks/e2e_step.py` so their figures compare."""
    return [
        f"actor_rollout_ref.model.path={work / 'model'}", f"data.train_files={train}", f"data.val_files={val}",
        f"trainer.default_local_dir={work / 'run'}", "trainer.n_gpus_per_node=1", "trainer.device=cuda",
        f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.save_at_end=false", f"trainer.logger={logger}", "data.max_prompt_length=96",
        "data.max_response_length=256", "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.actor.optim.lr=1e-6",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/gpu_grpo")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="results/gpu_grpo_step.json")
    args, extra = parser.parse_known_args()
    work = Path(args.workdir)
    start = time.perf_counter()
    params = build_model(work / "model")
    train, val = write_synthetic_dataset(work / "data", train_size=256, val_size=16, tasks=("arithmetic",))
    build_s = time.perf_counter() - start
    overrides = grpo_overrides(work, train, val, args.steps, "[console,jsonl]") + extra
    start = time.perf_counter()
    history = run(load_config(overrides))
    run_s = time.perf_counter() - start
    phases = sorted({k for r in history for k in r if k.startswith(("timing/", "rollout/", "memory/"))})
    print(f"\nQwen2 random init, {params / 1e6:.0f}M parameters, {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}")
    print("phase".ljust(28) + "".join(f"step {r['step']:>2}".rjust(10) for r in history))
    for phase in phases + ["perf/tokens", "perf/tokens_per_s", "response/length_mean", "reward/mean"]:
        print(phase.ljust(28) + "".join(f"{r.get(phase, float('nan')):10.3f}" for r in history))
    result = {"params": params, "build_s": build_s, "run_s": run_s, "overrides": overrides, "history": history,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
