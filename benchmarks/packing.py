"""Old-log-prob + PPO update on a batch with a realistic length spread: padded fixed micro-batches vs
packed (padding-free) forwards with token-budget micro-batches, measured in the same run.

    python -m benchmarks.packing [--sizes 0.5B,1.5B] [--rows 64] [--max-tokens 8192] [--out outputs/bench/packing.json]

The batch: prompts of 64..1024 tokens (uniform) and responses from a log-normal (long tail) with mean
about 25% of the 3072-token maximum, 4096 tokens at most per sequence, laid out as the rollout does (left-
padded prompts, right-padded responses). Random Qwen2 weights of the given shape (built here, no download),
one rank (`FSDPBackend` in this process), bf16 compute with fp32 master weights on GPU.
- padded: `use_remove_padding=false`, micro-batches of `max_tokens // padded_width` rows (the same number
  of token slots per micro-batch as the packed budget);
- packed: `use_remove_padding=true`, `use_dynamic_bsz=true` with `--max-tokens` per micro-batch
  (log-prob and update passes alike).
Each phase is timed after a warm-up on a small batch; peak memory is the CUDA allocator's peak of the phase.
Both modes start from the same weights; the log-probs of the two are compared on the real response tokens.
On CPU `--sizes tiny` (the default there) runs a small shape with 256-token sequences in fp32.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from protocol import DataProto
from workers.config import actor_rollout_ref_config
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.model_loading import worker_device
from workers.packing.attention import kernel_name
from workers.training.actor_loss import actor_forward, actor_loss
from workers.training.backend import ResponseForward
from workers.training.dist_utils import single_process_group
from workers.training.forward_pass import forward_rows, response_log_probs
from workers.training.micro_batching import MicroBatching
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates

# (hidden, intermediate, layers, heads, kv heads, vocab)
SHAPES = {
    "tiny": (128, 384, 4, 4, 2, 1024),
    "0.5B": (896, 4864, 24, 14, 2, 151936),
    "1.5B": (1536, 8960, 28, 12, 2, 151936),
}
MODES = ("padded", "packed")


def model_config(size: str, max_positions: int) -> Qwen2Config:
    hidden, inter, layers, heads, kv_heads, vocab = SHAPES[size]
    return Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max(max_positions, 4096),
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
    )


def length_spread(rows: int, max_prompt: int, max_response: int, seed: int) -> tuple[list[int], list[int]]:
    """Prompt lengths uniform in [max_prompt/16, max_prompt]; response lengths log-normal (sigma 1) with
    mean ~25% of max_response, clipped to [1, max_response]."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(max(1, max_prompt // 16), max_prompt + 1, (rows,), generator=generator)
    sigma = 1.0
    mu = math.log(0.25 * max_response) - sigma**2 / 2
    responses = torch.exp(mu + sigma * torch.randn(rows, generator=generator)).round().clamp(1, max_response).long()
    return prompts.tolist(), responses.tolist()


def rollout_batch(prompts: list[int], responses: list[int], vocab: int, seed: int) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    width_p, width_r = max(prompts), max(responses)
    rows = len(prompts)
    input_ids = torch.zeros(rows, width_p + width_r, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        input_ids[i, width_p - p : width_p + r] = torch.randint(2, vocab, (p + r,), generator=generator)
        mask[i, width_p - p : width_p + r] = 1
    shape = (rows, width_r)
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, width_p:], "response_mask": mask[:, width_p:],
        "advantages": torch.randn(rows, 1, generator=generator).expand(shape).contiguous(),
    })


def actor_settings(model_dir: str, mode: str, rows: int, micro_rows: int, max_tokens: int, checkpointing: bool) -> dict[str, Any]:
    packed = mode == "packed"
    return actor_rollout_ref_config({
        "model": {"path": model_dir, "use_remove_padding": packed, "enable_gradient_checkpointing": checkpointing},
        "actor": {
            "optim": {"lr": 1e-6, "weight_decay": 0.0},
            "ppo_mini_batch_size": rows // 2,  # two optimizer steps
            "ppo_micro_batch_size_per_gpu": micro_rows,
            "use_dynamic_bsz": packed,
            "ppo_max_token_len_per_gpu": max_tokens,
            "loss_agg_mode": "token-mean",
            "shuffle": False,
        },
        "rollout": {
            "log_prob_micro_batch_size_per_gpu": micro_rows,
            "log_prob_use_dynamic_bsz": packed,
            "log_prob_max_token_len_per_gpu": max_tokens,
        },
    })


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Phase:
    """Wall time and the allocator's peaks (CUDA) of one phase: allocated, and reserved (what the device sees of
    the process's tensors, cached free blocks included)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> "Phase":
        synchronize(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self.start
        on_cuda = self.device.type == "cuda"
        self.peak_gib = torch.cuda.max_memory_allocated(self.device) / 2**30 if on_cuda else None
        self.peak_reserved_gib = torch.cuda.max_memory_reserved(self.device) / 2**30 if on_cuda else None


def free_device_memory(device: torch.device) -> None:
    """Collect the dropped model and hand the allocator's cache back, so the next configuration starts empty."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def old_log_probs(engine: FSDPBackend, data: DataProto, config: dict[str, Any]) -> torch.Tensor:
    rollout = config["rollout"]
    batching = MicroBatching.for_call(
        {}, rollout["log_prob_micro_batch_size_per_gpu"], rollout["log_prob_use_dynamic_bsz"], rollout["log_prob_max_token_len_per_gpu"], "log_prob_max_token_len_per_gpu"
    )

    forward = ResponseForward("log_probs", with_entropy=True)
    return forward_rows(engine, data, batching, forward, response_log_probs)["log_probs"]


def update(engine: FSDPBackend, data: DataProto, config: dict[str, Any]) -> dict[str, float]:
    actor_cfg = config["actor"]
    schedule = PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0)
    loss_fn = lambda outputs, micro: actor_loss(outputs, micro, actor_cfg)  # noqa: E731
    return run_ppo_updates(engine, data, actor_forward(actor_cfg, 1.0), loss_fn, schedule, "update_actor")


def run_mode(model_dir: str, mode: str, data: DataProto, warmup: DataProto, args: argparse.Namespace, width: int) -> dict[str, Any]:
    device = worker_device()
    micro_rows = max(1, args.max_tokens // width)
    config = actor_settings(model_dir, mode, len(data), micro_rows, args.max_tokens, args.gradient_checkpointing)
    engine = FSDPBackend(AutoModelForCausalLM, config["model"], 0, optim_cfg=config["actor"]["optim"])
    result: dict[str, Any] = {"mode": mode, "micro_rows": micro_rows if mode == "padded" else None}
    try:
        warm_config = actor_settings(model_dir, mode, len(warmup), micro_rows, args.max_tokens, args.gradient_checkpointing)
        warmup.batch["old_log_probs"] = old_log_probs(engine, warmup, warm_config)
        update(engine, warmup, warm_config)
        with Phase(device) as phase:
            log_probs = old_log_probs(engine, data, config)
        result.update(logprob_s=phase.seconds, logprob_peak_gib=phase.peak_gib)
        data.batch["old_log_probs"] = log_probs
        with Phase(device) as phase:
            metrics = update(engine, data, config)
        result.update(update_s=phase.seconds, update_peak_gib=phase.peak_gib, pg_loss=metrics["pg_loss"], log_probs=log_probs)
    except torch.cuda.OutOfMemoryError as error:
        result.update(error=f"out of memory: {str(error).splitlines()[0]}")
    finally:
        del engine
        free_device_memory(device)
    return result


def run_size(size: str, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    max_prompt, max_response = args.max_prompt, args.max_response
    prompts, responses = length_spread(args.rows, max_prompt, max_response, seed=0)
    vocab = SHAPES[size][5]
    data = rollout_batch(prompts, responses, vocab, seed=1)
    warm_prompts, warm_responses = length_spread(8, max_prompt // 4, max_response // 4, seed=2)
    warmup = rollout_batch(warm_prompts, warm_responses, vocab, seed=3)
    model_dir = workdir / size
    torch.manual_seed(0)
    with torch.device(worker_device()):  # random init on the GPU is much faster than on the host
        model = Qwen2ForCausalLM(model_config(size, max_prompt + max_response))
    model.to(torch.bfloat16).save_pretrained(model_dir)
    del model
    width = data.batch["input_ids"].shape[1]
    real = int(data.batch["attention_mask"].sum())
    rows = []
    for mode in MODES:
        row = run_mode(str(model_dir), mode, data.select(deepcopy=True), warmup.select(deepcopy=True), args, width)
        row.update(size=size, rows=len(data), padded_width=width, real_tokens=real, padded_tokens=len(data) * width,
                   response_mean=sum(responses) / len(responses), response_max=max(responses))
        rows.append(row)
    padded, packed = rows
    if "error" not in padded and "error" not in packed:
        mask = data.batch["response_mask"].bool()
        gap = (padded.pop("log_probs") - packed.pop("log_probs"))[mask].abs()
        packed["logprob_gap_max"] = float(gap.max())
        packed["logprob_gap_mean"] = float(gap.mean())
        packed["speedup"] = (padded["logprob_s"] + padded["update_s"]) / (packed["logprob_s"] + packed["update_s"])
    for row in rows:
        row.pop("log_probs", None)
    return rows


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = "| size | mode | micro-batches | old-log-prob s | update s | total s | log-prob peak GiB | update peak GiB | speedup | max abs log-prob gap |"
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    for r in rows:
        if "error" in r:
            print(f"| {r['size']} | {r['mode']} | {r['error']} |")
            continue
        micro = f"{r['micro_rows']} rows" if r["micro_rows"] else "token budget"
        total = r["logprob_s"] + r["update_s"]
        print(
            f"| {r['size']} | {r['mode']} | {micro} | {fmt(r['logprob_s'])} | {fmt(r['update_s'])} | {fmt(total)} | "
            f"{fmt(r['logprob_peak_gib'])} | {fmt(r['update_peak_gib'])} | {fmt(r.get('speedup'))} | {fmt(r.get('logprob_gap_max'), 4)} |"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.5B,1.5B" if on_gpu else "tiny", help=f"comma-separated, of {list(SHAPES)}")
    parser.add_argument("--rows", type=int, default=64 if on_gpu else 16, help="sequences in the batch (even)")
    parser.add_argument("--max-prompt", type=int, default=1024 if on_gpu else 64)
    parser.add_argument("--max-response", type=int, default=3072 if on_gpu else 192)
    parser.add_argument("--max-tokens", type=int, default=8192 if on_gpu else 512, help="token slots per micro-batch (both passes)")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=on_gpu)
    parser.add_argument("--out", default="outputs/bench/packing.json")
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; valid: {list(SHAPES)}")
    if args.rows < 2 or args.rows % 2:
        parser.error(f"--rows={args.rows} must be an even number >= 2 (two optimizer steps)")
    if args.max_tokens < args.max_prompt + args.max_response:
        parser.error(f"--max-tokens={args.max_tokens} must hold one whole sequence ({args.max_prompt + args.max_response} tokens)")
    device = worker_device()
    rows: list[dict[str, Any]] = []
    with single_process_group(device), tempfile.TemporaryDirectory() as workdir:
        for size in sizes:
            rows.extend(run_size(size, args, Path(workdir)))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    report = {
        "command": "python -m benchmarks.packing " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "attention_kernel": kernel_name(device, dtype),
        "settings": vars(args),
        "rows": rows,
    }
    print_table(rows)
    print(f"attention kernel: {report['attention_kernel']}; device: {report['device']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
