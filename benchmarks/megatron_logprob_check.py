"""Megatron model vs the HF model on the same inputs: response log-probs (bf16), and one training step's time.

    python -m benchmarks.megatron_logprob_check --workdir /tmp/mcheck [--out results/megatron_logprob_check.json]
    torchrun --nproc-per-node 2 -m benchmarks.megatron_logprob_check --tp 2        # (or --pp 2) on 2 GPUs

Builds a random-init Qwen2 of the Qwen2.5-0.5B shape, loads it into `MegatronBackend` (megatron-core
GPTModel, TP x PP from the flags), and scores 16 left-padded prompts + 256 response tokens. The reference
is the HF model in float32; the HF model in bf16 on the same inputs shows what bf16 alone costs. Then
times forward+backward+Adam on the same batch for both (the HF one unsharded, plain torch AdamW).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.gpu_grpo_step import build_model
from protocol import DataProto

PROMPT, RESPONSE, ROWS = 96, 256, 16
OPTIM = {"lr": 1e-6, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8, "lr_warmup_steps": 0,
         "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant", "min_lr_ratio": 0.0, "total_training_steps": None}


def batch(vocab: int) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (ROWS, PROMPT + RESPONSE), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(ROWS):
        mask[row, : (row * 5) % PROMPT] = 0  # prompts of different lengths, left-padded
        mask[row, PROMPT + RESPONSE - (row * 7) % 64 :] = 0  # responses of different lengths
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": positions,
                                "responses": ids[:, PROMPT:], "response_mask": mask[:, PROMPT:]})


def hf_log_probs(path: Path, data: DataProto, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    out = []
    with torch.no_grad():
        for micro in data.split(4):
            inputs = {k: micro.batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids")}
            logits = model(**inputs, use_cache=False).logits[:, -RESPONSE - 1 : -1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, micro.batch["responses"].to(device)[..., None]).squeeze(-1).cpu())
    del model
    torch.cuda.empty_cache()
    return torch.cat(out)


def hf_train_step_s(path: Path, data: DataProto, device: torch.device) -> float:
    """Forward+backward+AdamW of the HF model (fp32 weights, bf16 autocast) on the batch; seconds, 2nd of 2."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for micro in data.split(4):
            inputs = {k: micro.batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids")}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(**inputs, use_cache=False).logits[:, -RESPONSE - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, micro.batch["responses"].to(device)[..., None]).squeeze(-1)
            (-lp.mean() / 4).backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    del model, optimizer
    torch.cuda.empty_cache()
    return times[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/megatron_check")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--out", default="results/megatron_logprob_check.json")
    args = parser.parse_args()
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    work = Path(args.workdir)
    if rank == 0:
        build_model(work / "model")
    dist.barrier()

    from megatron.core import parallel_state as ps

    from workers.megatron.backend import MegatronBackend
    from workers.megatron.model import ParallelSettings
    from workers.training.backend import ResponseForward

    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
    settings = ParallelSettings(args.tp, args.pp, sequence_parallel=args.tp > 1)
    engine = MegatronBackend({"path": str(work / "model"), "dtype": "bfloat16"}, settings, OPTIM)
    data = batch(engine.layout.vocab_size)
    micros = list(data.split(4))
    forward = ResponseForward("log_probs", 1.0)

    def keep(outputs, micro):
        return {"log_probs": outputs.log_probs.cpu()}

    def loss(outputs, micro):
        return -outputs.log_probs.mean() / len(micros), {}

    kept = engine.forward_only(micros, forward, keep)
    step_times = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.zero_grad()
        engine.forward_backward(micros, forward, loss)
        engine.optimizer_step(1.0)
        torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    is_reporter = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
    if is_reporter:
        megatron = torch.cat([k["log_probs"] for k in kept])
    del engine
    torch.cuda.empty_cache()
    if not is_reporter:
        dist.barrier()
        return
    valid = data.batch["response_mask"].bool()
    reference = hf_log_probs(work / "model", data, torch.float32, device)
    hf_bf16 = hf_log_probs(work / "model", data, torch.bfloat16, device)

    def gap(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
        diff = (a - b).abs()[valid]
        return {"max": float(diff.max()), "mean": float(diff.mean())}

    result = {
        "device": torch.cuda.get_device_name(device), "tp": args.tp, "pp": args.pp, "tokens_scored": int(valid.sum()),
        "megatron_bf16_vs_hf_fp32": gap(megatron, reference), "hf_bf16_vs_hf_fp32": gap(hf_bf16, reference),
        "megatron_bf16_vs_hf_bf16": gap(megatron, hf_bf16), "megatron_train_step_s": step_times[-1],
        "megatron_peak_gib": peak, "hf_train_step_s": hf_train_step_s(work / "model", data, device) if args.tp * args.pp == 1 else None,
    }
    for key, value in result.items():
        print(f"{key:28s} {value}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    dist.barrier()


if __name__ == "__main__":
    main()
