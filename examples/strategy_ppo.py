"""PPO with a hand-written actor worker (`StrategyPPOWorker`, built on the strategy API), driven by a
plain loop: sample, score, group-normalize the rewards, train.

    python -m examples.strategy_ppo [--engine hf|vllm] [--backend fsdp2|megatron] [--world-size N] [--steps N] [--model DIR] [--history-json F]
        [--moe [--router-aux-loss-coef C]]     # the tiny mixture of experts, its routers' load-balancing loss

The task: "write 8 digits." in a few phrasings; the reward is the fraction of the first 8 response
characters that are digits (the tiny model's tokenizer has one token per character). A random tiny model
scores ~0.1. On a GPU the same command runs unchanged (each worker picks its device from its environment).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path
from typing import Any

import torch

from examples.strategy_ppo_worker import StrategyPPOWorker
from single_controller.need_parallel import NeedParallel
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from trainer.rewards.char_class import compute_char_class_score

PHRASINGS = ("write 8 digits.", "please write 8 digits.", "reply with 8 digits.", "give me 8 digits, nothing else.")
TARGET = "digits:8"


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)  # a BatchEncoding in transformers 5


def group_advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO: each reward minus its prompt group's mean, over the group's standard deviation."""
    values = torch.tensor(rewards).view(-1, group)
    normalized = (values - values.mean(1, keepdim=True)) / (values.std(1, keepdim=True) + 1e-6)
    return normalized.flatten().tolist()


def memory_note(metrics: dict[str, float]) -> str:
    """GPU: device memory in use while the engine generates, sleeps, and after the update (GiB)."""
    phases = ("generate", "engine_asleep", "train", "optimizer_offloaded", "engine_updated")
    keys = [f"memory/{phase}/gpu_used_gib" for phase in phases]
    if not all(key in metrics for key in keys):
        return ""
    return "  gpu_used_gib " + " ".join(f"{phase}={metrics[key]:.2f}" for phase, key in zip(phases, keys))


def run(model_path: str, steps: int = 25, engine_type: str = "hf", world_size: int = 2, use_gpu: bool | None = None,
        backend: str = "fsdp2", router_aux_loss_coef: float | None = None,
        prompts_per_step: int = 8, samples_per_prompt: int = 8, lr: float = 5e-3, seed: int = 0) -> dict[str, Any]:
    from transformers import AutoTokenizer

    use_gpu = torch.cuda.is_available() if use_gpu is None else use_gpu
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    config = {
        "model_path": model_path, "engine_type": engine_type, "lr": lr, "clip_ratio": 0.2, "micro_batch_size": 16,
        "strategy": {"backend": backend, "grad_clip": 1.0, "optimizer_offload": True, "seed": seed,
                     "router_aux_loss_coef": router_aux_loss_coef},
        "inference": {"group_size": 1, "cpu_kv_cache_mb": 64, "max_model_len": 128},
    }
    pool = RayResourcePool([world_size], use_gpu=use_gpu, name_prefix="strategy_ppo_")
    actor = RayWorkerGroup(pool, RayClassWithInitArgs(StrategyPPOWorker, config=config))
    actor.init_model()
    sampling = {"temperature": 1.0, "max_tokens": 8, "stop_token_ids": [tokenizer.eos_token_id]}
    rng = random.Random(seed)
    history = []
    try:
        for step in range(steps):
            texts = [rng.choice(PHRASINGS) for _ in range(prompts_per_step)]
            prompt_ids = [encode_prompt(tokenizer, text) for text in texts for _ in range(samples_per_prompt)]
            results = actor.generate(NeedParallel(prompt_ids), sampling)
            responses = [tokenizer.decode(r["token_ids"], skip_special_tokens=True) for r in results]
            rewards = [compute_char_class_score(text, TARGET) for text in responses]
            advantages = group_advantages(rewards, samples_per_prompt)
            experience = [
                {"prompt": p, "response": r["token_ids"], "old_log_probs": r["log_probs"], "advantage": a}
                for p, r, a in zip(prompt_ids, results, advantages)
            ]
            metrics = actor.ppo_train(NeedParallel(experience))[0]
            history.append({"step": step, "reward": sum(rewards) / len(rewards), **metrics})
            print(f"step {step:3d}  reward {history[-1]['reward']:.3f}  loss {metrics['actor/loss']:+.4f}  "
                  f"grad_norm {metrics['actor/grad_norm']:.3f}  sync_diff {metrics.get('rollout/sync_logprob_max_diff', 0):.2e}  "
                  f"sample {responses[0]!r}{memory_note(metrics)}", flush=True)
    finally:
        actor.kill()
        pool.release()
    return {"history": history}


def main() -> None:
    from single_controller.ray.local_cluster import init_local_ray, prepend_pythonpath
    from trainer.tiny_model import build_tiny_model
    from trainer.tiny_moe import build_tiny_moe

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: outputs/tiny_model (with --moe: outputs/tiny_moe)")
    parser.add_argument("--moe", action="store_true", help="the tiny mixture of experts, built if the folder is missing")
    parser.add_argument("--router-aux-loss-coef", type=float, default=None, help="a mixture of experts' routers' "
                        "load-balancing loss, averaged over the layers (the strategy's router_aux_loss_coef)")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--backend", choices=("fsdp2", "megatron"), default="fsdp2")
    parser.add_argument("--world-size", type=int, default=None, help="default: the GPU count, or 2 on CPU")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--history-json", default=None, help="also write the per-step metrics here")
    args = parser.parse_args()
    model = args.model or ("outputs/tiny_moe" if args.moe else "outputs/tiny_model")
    if not Path(model).is_dir() and args.moe:
        build_tiny_moe(model)
    elif not Path(model).is_dir():
        build_tiny_model(Path(model))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    world_size = args.world_size or (torch.cuda.device_count() or 2)
    # The workers import this folder's code and whatever the user's PYTHONPATH names (packages installed with --target).
    init_local_ray(num_cpus=max(4, world_size), runtime_env={"env_vars": {"PYTHONPATH": prepend_pythonpath(os.getcwd())}})
    history = run(model, steps=args.steps, engine_type=args.engine, world_size=world_size, backend=args.backend,
                  router_aux_loss_coef=args.router_aux_loss_coef)["history"]
    last = history[-3:]  # fewer with fewer steps
    first, last_mean = history[0]["reward"], sum(h["reward"] for h in last) / len(last)
    print(f"reward: first step {first:.3f}, mean of the last {len(last)} steps {last_mean:.3f}")
    if args.history_json:
        Path(args.history_json).write_text(json.dumps(history, indent=1))


if __name__ == "__main__":
    main()
