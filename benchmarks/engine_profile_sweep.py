"""vLLM's start-up profile peak beside the memory plan's two terms for it, over the engine's step limits.

    python -m benchmarks.engine_profile_sweep --size 7B --layers 2 [--lora-rank 64] \
        [--variants 1024x2048,256x2048,16x16384,16x8192] --workdir /tmp/eps --out results/engine_profile_sweep.json

vLLM sizes its KV cache after a profile run: one forward over `max_num_batched_tokens` tokens, then its sampler over
`max_num_seqs` requests. The torch peak it reports (`rollout/engine_memory/activation_peak_gib`) is the larger of the
two (a mixture of experts keeps its fused-MoE workspace through the sampler), and the plan counts each
(trainer/memory_plan/engine_profile.py: bytes per logit for the sampler, per token for the forward). One reading at
vLLM's defaults cannot tell them apart; this sweep's readings (H200, 2026-12-02) set the plan's counts.

Each variant `SEQSxTOKENS` starts an engine (eager, in a child process, released when it exits) over a random-init
model of the size cut to `--layers` decoder layers (the forward's peak is one layer's; the vocabulary is whole) and
reads vLLM's peak. A variant of few sequences shows the forward, one of few tokens the sampler: the table gives each
reading per logit and per token beside the plan's terms. `--dry-run` prints the plan's side only (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.random_model import write_config, write_model_folder
from benchmarks.scale_step import SHAPES, shape_of
from trainer.config_loader import load_config
from trainer.memory_plan.engine_profile import forward_profile_bytes, sampling_peak_bytes
from trainer.memory_plan.gpu import GIB, detect_gpu_bytes
from trainer.memory_plan.setup import plan_setup

DEFAULT_VARIANTS = "1024x2048,256x2048,16x16384,16x8192"
ROLLOUT = {"name": "vllm", "gpu_memory_utilization": 0.5, "enforce_eager": True, "max_model_len": 1024}


@dataclass(frozen=True)
class Variant:
    seqs: int  # rollout.max_num_seqs
    tokens: int  # rollout.max_num_batched_tokens


@dataclass
class Reading:
    seqs: int
    tokens: int
    plan_sampler_gib: float  # the plan's peak while sampling: the sampler's own and a MoE's workspace
    plan_forward_gib: float
    measured_gib: float | None  # vLLM's activation peak; None in a dry run or where vLLM kept no figure
    per_logit_bytes: float | None  # the reading over seqs x vocabulary (the sampler's, where it is the peak)
    per_token_bytes: float | None  # the reading over tokens (the forward's, where it is the peak)


def parse_variants(text: str) -> list[Variant]:
    """`SEQSxTOKENS,...`; vLLM needs max_num_batched_tokens >= max_num_seqs."""
    variants = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--variants item {item!r}: expected SEQSxTOKENS of positive integers, e.g. 1024x2048")
        seqs, tokens = int(parts[0]), int(parts[1])
        if tokens < seqs:
            raise ValueError(
                f"--variants item {item!r}: vLLM needs max_num_batched_tokens ({tokens}) >= max_num_seqs ({seqs})"
            )
        variants.append(Variant(seqs, tokens))
    return variants


def variant_overrides(model: str, variant: Variant, lora_rank: int) -> list[str]:
    """The config of one variant, as trainer overrides (the plan reads it; the engine is built from the same)."""
    rollout = {**ROLLOUT, "max_num_seqs": variant.seqs, "max_num_batched_tokens": variant.tokens}
    overrides = [f"actor_rollout_ref.model.path={model}", "trainer.n_gpus_per_node=1"]
    overrides += [f"actor_rollout_ref.rollout.{key}={value}" for key, value in rollout.items()]
    if lora_rank:
        overrides.append(f"actor_rollout_ref.model.lora_rank={lora_rank}")
    return overrides


def planned(model: str, variant: Variant, lora_rank: int, gpu_bytes: int | None) -> tuple[float, float]:
    """The plan's (sampling, forward) profile terms of the variant, in GiB."""
    setup = plan_setup(load_config(variant_overrides(model, variant, lora_rank)), on_gpu=True)
    return sampling_peak_bytes(setup, gpu_bytes) / GIB, forward_profile_bytes(setup, gpu_bytes) / GIB


def reading(variant: Variant, vocab: int, plan: tuple[float, float], measured: float | None) -> Reading:
    peak = None if measured is None else measured * GIB
    return Reading(
        variant.seqs, variant.tokens, plan[0], plan[1], measured,
        None if peak is None else peak / (variant.seqs * vocab),
        None if peak is None else peak / variant.tokens,
    )


def measure_one(model: str, variant: Variant, lora_rank: int) -> dict[str, float]:
    """In this process: start the engine, read vLLM's start-up figures (GiB), shut it down."""
    import torch

    from trainer.role_groups import actor_worker_config
    from workers.config import actor_rollout_ref_config
    from workers.lora.spec import LoraSpec
    from workers.rollout.vllm_engine import VLLMEngine

    cfg = load_config(variant_overrides(model, variant, lora_rank))
    section = actor_rollout_ref_config(actor_worker_config(cfg))  # the section as the actor worker completes it
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")  # CPU: plumbing only
    engine = VLLMEngine(model, section["rollout"], torch.bfloat16, device, seed=0,
                        lora=LoraSpec.from_model_config(section["model"]))
    try:
        return engine.start_memory_figures()
    finally:
        engine.close()


def measure(model: str, variant: Variant, lora_rank: int) -> dict[str, float]:
    """`measure_one` in a child process, so each engine's memory goes with it."""
    command = [sys.executable, "-m", "benchmarks.engine_profile_sweep", "--one", f"{variant.seqs}x{variant.tokens}",
               "--model", model, "--lora-rank", str(lora_rank)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        raise RuntimeError(f"the engine of variant {variant.seqs}x{variant.tokens} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_table(readings: list[Reading]) -> None:
    print("  seqs  tokens   plan sampler  plan forward   vLLM peak   bytes/logit  bytes/token")
    for r in readings:
        seen = "-" if r.measured_gib is None else f"{r.measured_gib:.3f}"
        logit = "-" if r.per_logit_bytes is None else f"{r.per_logit_bytes:.1f}"
        token = "-" if r.per_token_bytes is None else f"{r.per_token_bytes:.0f}"
        plan = f"{r.plan_sampler_gib:15.3f}{r.plan_forward_gib:14.3f}"
        print(f"{r.seqs:6d}{r.tokens:8d}{plan}{seen:>12}{logit:>14}{token:>13}")


def main(argv: list[str] | None = None) -> list[Reading]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="7B", help=f"one of {list(SHAPES)}")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers kept (the vocabulary stays whole)")
    parser.add_argument("--lora-rank", type=int, default=0, help="> 0: the engine serves LoRA adapters of this rank")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS,
                        help="SEQSxTOKENS,... (max_num_seqs x max_num_batched_tokens)")
    parser.add_argument("--dry-run", action="store_true", help="the plan's terms only: no model weights, no engine")
    parser.add_argument("--workdir", default="/tmp/engine_profile_sweep")
    parser.add_argument("--out", default="results/engine_profile_sweep.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's variant
    parser.add_argument("--model", help=argparse.SUPPRESS)  # a child's model folder
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.model, parse_variants(args.one)[0], args.lora_rank)))
        return []
    if args.size not in SHAPES:
        parser.error(f"--size {args.size!r}: expected one of {list(SHAPES)}")
    variants = parse_variants(args.variants)
    name, shape = shape_of(args.size, args.layers)
    model = str(Path(args.workdir) / name / "model")
    if args.dry_run:
        write_config(model, shape)
    elif not (Path(model) / "model.safetensors.index.json").exists():  # an earlier run may have written it
        write_model_folder(model, shape)
    gpu_bytes = detect_gpu_bytes()
    readings = []
    for variant in variants:
        figures = {} if args.dry_run else measure(model, variant, args.lora_rank)
        readings.append(reading(variant, shape["vocab_size"], planned(model, variant, args.lora_rank, gpu_bytes),
                                figures.get("activation_peak")))
    print(f"{name}, LoRA rank {args.lora_rank}: vLLM's profile peak (GiB) against the plan's terms")
    print_table(readings)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"size": name, "lora_rank": args.lora_rank, "gpu_bytes": gpu_bytes,
              "commit": os.environ.get("SUITE_COMMIT"), "readings": [asdict(r) for r in readings]}
    out.write_text(json.dumps(record, indent=2))
    return readings


if __name__ == "__main__":
    main()
