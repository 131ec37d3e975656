"""Synchronous vs one-step-off vs asynchronous GRPO (rollout.async_training=true, max_staleness 1, 2, 4), same steps:
step time, trained tokens/s, mean staleness and the reward curve of each, in one process.

    python -m benchmarks.async_rl --preset gpu-longtail [--gpus 1|2] [--steps 14]
    python -m benchmarks.async_rl --preset gpu-7b --gpus 2 [--steps 8]
        [--modes sync,one_step_off,async1,async2,async4] [--long-tokens 1024] [--long-fraction 0.1]
    python -m benchmarks.async_rl --preset cpu-learning [--steps 40]
    python -m benchmarks.async_rl --preset cpu-longtail [--steps 6]      # the long-tail run at CPU size

Every mode uses the separate placement: the actor (FSDP) and one vLLM engine in pools of their own. On one
GPU both take half of it (`trainer.gpus_per_process=0.5`, `rollout.gpus_per_engine=0.5`: weights by CUDA
IPC); with `--gpus 2` each has a GPU of its own (weights by NCCL broadcast); on CPU they are two processes.
Truncated importance sampling (`tis_imp_ratio_cap`) is on in every mode.

Presets:
- gpu-longtail: a random-init Qwen2 of the Qwen2.5-0.5B shape, the arithmetic task, 16 prompts x 8 samples,
  and the issue's long tail forced per prompt (`extra_info.forced_response_length`, which the engine honours
  exactly): 90% of prompts 32-64 tokens, 10% 1024. A synchronous step waits for its 1024-token group while
  most of the engine's batch is empty; the asynchronous engine keeps its batch full with the next prompts
  and the long group overlaps up to max_staleness updates.
- gpu-7b: the same workload on the Qwen2.5-7B shape, the actor (full fine-tune, parameters and Adam state
  offloaded between phases, gradient checkpointing) on one GPU and the engine on the other (`--gpus 2` only;
  the plan's peak, the optimizer step, needs an H200's memory).
- cpu-learning: the default tiny task (char_class, 8 tokens) on the tiny model; the learning check: each
  mode's final reward (mean of the last 5 steps, averaged over `--seeds`) within 0.05 of the synchronous
  run's. Use several seeds: a single run can stall on a plateau (seed 0's synchronous run stays near 0.89).
- cpu-longtail: the long-tail shape at CPU size (90% 8-16 tokens, 10% 128) on the tiny model.

Throughput = tokens of the trained batches (prompt + response) / wall time of all steps (the pipeline fill
of the asynchronous runs included); the step time is the steady state (mean of steps 3..N).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.driver_profile import driver_profile
from trainer.config_loader import load_config
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.main import run
from workers.rollout.sampling import FORCED_RESPONSE_LENGTH

MODES = {
    "sync": ["actor_rollout_ref.rollout.async_training=false", "actor_rollout_ref.rollout.staleness=0"],
    "one_step_off": ["actor_rollout_ref.rollout.async_training=false", "actor_rollout_ref.rollout.staleness=1"],
    **{f"async{k}": ["actor_rollout_ref.rollout.async_training=true", f"actor_rollout_ref.rollout.max_staleness={k}"]
       for k in (1, 2, 4)},
}
SEPARATE = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.num_engines=1",
            "trainer.n_gpus_per_node=1", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_at_end=false",
            "trainer.resume_mode=disable", "trainer.logger=[jsonl]", "actor_rollout_ref.rollout.tis_imp_ratio_cap=2.0"]
SPEEDUP_TARGET, LEARNING_TOLERANCE = 1.8, 0.05


@dataclass(frozen=True)
class Tail:
    """The long-tail presets' long responses: their length (None: the preset's) and share of the prompts."""

    tokens: int | None
    fraction: float


def force_lengths(parquet: Path, short: tuple[int, int], long: int, long_fraction: float, seed: int) -> list[int]:
    """Give every prompt of `parquet` its response length (written into extra_info): `long` for a
    `long_fraction` of them, uniform in `short` otherwise. Returns the lengths."""
    table = pq.read_table(parquet)
    rng = np.random.default_rng(seed)
    lengths = [long if rng.random() < long_fraction else int(rng.integers(short[0], short[1] + 1)) for _ in range(table.num_rows)]
    infos = [{**(info or {}), FORCED_RESPONSE_LENGTH: length} for info, length in zip(table.column("extra_info").to_pylist(), lengths)]
    table = table.set_column(table.column_names.index("extra_info"), "extra_info", pa.array(infos))
    pq.write_table(table, parquet)
    return lengths


# Where the actor and the engine run on the GPU presets: sharing one GPU, or a GPU each.
GPU_LAYOUTS = {
    1: ["trainer.gpus_per_process=0.5", "actor_rollout_ref.rollout.gpus_per_engine=0.5"],
    2: ["trainer.gpus_per_process=1", "actor_rollout_ref.rollout.gpus_per_engine=null"],
}
DEFAULT_STEPS = {"gpu-longtail": 14, "gpu-7b": 8, "cpu-learning": 40, "cpu-longtail": 6}
STEADY_PHASES = ("sync_weights", "generate", "wait_rollout", "old_log_prob", "ref_log_prob", "update_actor")


def gpu_longtail(work: Path, tail: Tail) -> tuple[list[str], dict[str, Any]]:
    from benchmarks.gpu_grpo_step import build_model
    from benchmarks.model_shapes import QWEN2_0_5B

    params = build_model(work / "model", QWEN2_0_5B)
    train, val = write_synthetic_dataset(work / "data", train_size=512, val_size=16, tasks=("arithmetic",))
    long = tail.tokens or 1024
    lengths = force_lengths(train, (32, 64), long, tail.fraction, seed=0)
    long_fraction = float(np.mean(np.array(lengths) == long))
    overrides = gpu_longtail_overrides(work / "model", train, val, long)
    return overrides, {"params": params, "long_tokens": long, "long_fraction": long_fraction}


def gpu_longtail_overrides(model: Path, train: Path, val: Path, long: int) -> list[str]:
    """The gpu-longtail run's settings (its GPU layout is added from GPU_LAYOUTS)."""
    return [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
        "trainer.device=cuda", "actor_rollout_ref.rollout.gpu_memory_utilization=0.25",
        "actor_rollout_ref.rollout.enforce_eager=false", "data.max_prompt_length=96", f"data.max_response_length={long}",
        "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096", "actor_rollout_ref.actor.optim.lr=1e-6",
    ]


# gpu-7b: the actor (full fine-tune, on a GPU of its own) keeps its parameters and Adam state on the host between
# the phases that need them; its engine has the other GPU to itself.
SEVEN_B_ACTOR = ["actor_rollout_ref.actor.fsdp_config.param_offload=true",
                 "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.rollout.gpu_memory_utilization=0.85"]


def gpu_7b(work: Path, tail: Tail) -> tuple[list[str], dict[str, Any]]:
    """The gpu-longtail workload on the Qwen2.5-7B shape (random init, written once): --gpus 2 only."""
    from benchmarks.e2e_step import SHAPES, model_folder

    params = model_folder(work / "model", SHAPES["7B"], reuse=True)
    train, val = write_synthetic_dataset(work / "data", train_size=512, val_size=16, tasks=("arithmetic",))
    long = tail.tokens or 1024
    lengths = force_lengths(train, (32, 64), long, tail.fraction, seed=0)
    overrides = [*gpu_longtail_overrides(work / "model", train, val, long), *SEVEN_B_ACTOR]
    return overrides, {"params": params, "long_tokens": long, "long_fraction": float(np.mean(np.array(lengths) == long))}


def cpu_model_and_data(work: Path) -> tuple[Path, Path, Path]:
    from trainer.tiny_model import build_tiny_model

    model = build_tiny_model(work / "model", seed=0)
    train, val = write_synthetic_dataset(work / "data", train_size=512, val_size=32, seed=0)
    return Path(model), train, val


def cpu_learning(work: Path, tail: Tail) -> tuple[list[str], dict[str, Any]]:
    model, train, val = cpu_model_and_data(work)
    return [f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}"], {}


def cpu_longtail(work: Path, tail: Tail) -> tuple[list[str], dict[str, Any]]:
    model, train, val = cpu_model_and_data(work)
    long = tail.tokens or 128
    lengths = force_lengths(train, (8, 16), long, tail.fraction, seed=0)
    overrides = [f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
                 f"data.max_response_length={long}", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    return overrides, {"long_tokens": long, "long_fraction": float(np.mean(np.array(lengths) == long))}


PRESETS = {"gpu-longtail": gpu_longtail, "gpu-7b": gpu_7b, "cpu-learning": cpu_learning, "cpu-longtail": cpu_longtail}
# Presets whose actor and engine cannot share one GPU.
TWO_GPUS_ONLY = {"gpu-7b"}


def mean(history: list[dict[str, float]], key: str, first: int = 1) -> float:
    values = [r[key] for r in history if r["step"] >= first and key in r]
    return float(np.mean(values)) if values else float("nan")


def summarize_seeds(histories: list[list[dict[str, float]]]) -> dict[str, Any]:
    """Each measure averaged over the seeds' runs (the reward curve step by step), plus each seed's final reward."""
    each = [summarize(h) for h in histories]
    out: dict[str, Any] = {k: float(np.mean([e[k] for e in each])) for k in each[0] if k != "reward_curve"}
    out["final_reward_per_seed"] = [e["final_reward"] for e in each]
    out["reward_curve"] = [float(v) for v in np.mean([e["reward_curve"] for e in each], axis=0)]
    return out


def summarize(history: list[dict[str, float]]) -> dict[str, Any]:
    wall = sum(r["timing/wall_step_s"] for r in history)
    reward = [r["reward/mean"] for r in history]
    outside = [{"step": r["step"], "outside": r["timing/wall_step_s"] - r["timing/step_s"]} for r in history]
    return {
        "step_s": mean(history, "timing/wall_step_s", first=3),
        "tokens_per_s": sum(r["perf/tokens"] for r in history) / wall,
        "run_s": wall,
        # Where a steady step's time goes: its phases, and the driver's time outside them (metrics, logging,
        # the calls that collect the workers' logs), with the dispatch and collect time of every call.
        **{f"{phase}_s": mean(history, f"timing/{phase}_s", first=3) for phase in STEADY_PHASES},
        "outside_phases_s": mean(outside, "outside", first=3),
        "dispatch_collect_s": mean(history, "overhead/dispatch_collect_s", first=3),
        "worker_metrics_s": mean(history, "timing/worker_metrics_s", first=3),  # inside outside_phases_s
        # async: the polls' round trips into the engines and the time inside the engines' method
        "exchange_s": mean(history, "async/exchange_s", first=3),
        "exchange_in_worker_s": mean(history, "async/exchange_in_worker_s", first=3),
        "share_out_s": mean(history, "async/share_out_s", first=3),
        "filing_s": mean(history, "async/filing_s", first=3),
        "wait_thread_cpu_s": mean(history, "async/wait_thread_cpu_s", first=3),
        "wait_process_cpu_s": mean(history, "async/wait_process_cpu_s", first=3),
        "staleness_mean": mean(history, "rollout/staleness"),
        "staleness_max": max((r.get("rollout/staleness_max", r.get("rollout/staleness", 0.0)) for r in history), default=0.0),
        "multi_version_fraction": mean(history, "rollout/multi_version_fraction"),
        "dropped_or_regenerated": max((r.get("async/dropped_total", 0) + r.get("async/regenerated_total", 0) for r in history), default=0),
        "response_length_mean": mean(history, "response/length_mean"),
        "final_reward": float(np.mean(reward[-5:])),
        "reward_curve": reward,
    }


def verdict(preset: str, summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if "sync" not in summaries:
        return {}
    base = summaries["sync"]
    out: dict[str, Any] = {f"{mode}_speedup": s["tokens_per_s"] / base["tokens_per_s"] for mode, s in summaries.items()}
    out.update({f"{mode}_reward_gap": s["final_reward"] - base["final_reward"] for mode, s in summaries.items()})
    if preset == "cpu-learning":
        out["learning_matches_sync"] = all(abs(out[f"{m}_reward_gap"]) <= LEARNING_TOLERANCE for m in summaries)
    else:
        best = max((m for m in summaries if m.startswith("async")), key=lambda m: out[f"{m}_speedup"], default=None)
        out["best_async"] = best
        out["speedup_met"] = best is not None and out[f"{best}_speedup"] >= SPEEDUP_TARGET
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu-learning", choices=list(PRESETS))
    parser.add_argument("--steps", type=int, default=None, help=f"steps per mode (default: {DEFAULT_STEPS})")
    parser.add_argument("--gpus", type=int, default=1, choices=sorted(GPU_LAYOUTS),
                        help="GPU presets: 1 (actor and engine share it) or 2 (a GPU each)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seeds", default="0", help="trainer.seed of each run, comma-separated (measures are averaged)")
    parser.add_argument("--long-tokens", type=int, default=None, help="length of the long tail (default: 1024 gpu-longtail, 128 cpu-longtail)")
    parser.add_argument("--long-fraction", type=float, default=0.1, help="share of prompts forced to the long length")
    parser.add_argument("--workdir", default="/tmp/async_rl")
    parser.add_argument("--out", default=None, help="JSON results (default results/async_rl_<preset>.json)")
    parser.add_argument("--profile-driver", type=Path, default=None, metavar="DIR",
                        help="cProfile the driver of each run into DIR (<mode>_seed<k>.prof and .txt, the top functions "
                             "by cumulative time); the profiler slows the driver, so its step times are not the benchmark's")
    args, extra = parser.parse_known_args()
    modes = args.modes.split(",")
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; valid: {list(MODES)}")
    if args.preset in TWO_GPUS_ONLY and args.gpus != 2:
        parser.error(f"--preset {args.preset} needs --gpus 2: a 7B actor and its engine do not share one GPU")
    steps = args.steps or DEFAULT_STEPS[args.preset]
    out = Path(args.out or f"results/async_rl_{args.preset}.json")
    work = Path(args.workdir) / args.preset
    started = time.perf_counter()
    overrides, workload = PRESETS[args.preset](work, Tail(args.long_tokens, args.long_fraction))
    if args.preset.startswith("gpu"):
        overrides += GPU_LAYOUTS[args.gpus]
        workload["gpus"] = args.gpus
    runs: dict[str, dict[str, Any]] = {}
    seeds = [int(seed) for seed in args.seeds.split(",")]
    for mode in modes:
        histories, per_seed = [], []
        for seed in seeds:
            run_overrides = [*overrides, *SEPARATE, *MODES[mode], f"trainer.total_training_steps={steps}", f"trainer.seed={seed}",
                             f"trainer.default_local_dir={work / 'runs' / f'{mode}_seed{seed}'}", *extra]
            with driver_profile(args.profile_driver, f"{mode}_seed{seed}"):
                histories.append(run(load_config(run_overrides)))
            per_seed.append({"seed": seed, "history": histories[-1], "overrides": run_overrides})
        runs[mode] = {"summary": summarize_seeds(histories), "runs": per_seed}
        write(out, args, extra, workload, runs, verdict(args.preset, {m: r["summary"] for m, r in runs.items()}), started)
    summaries = {m: r["summary"] for m, r in runs.items()}
    report(args.preset, steps, workload, summaries, verdict(args.preset, summaries))
    print(f"wrote {out} ({time.perf_counter() - started:.0f} s)")


def write(out: Path, args: argparse.Namespace, extra: list[str], workload: dict, runs: dict, result: dict, started: float) -> None:
    """After every mode, so a run stopped by a time limit keeps what was measured."""
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "extra": extra, "workload": workload, "verdict": result,
                               "elapsed_s": time.perf_counter() - started, "runs": runs}, indent=2))


def report(preset: str, steps: int, workload: dict, summaries: dict[str, dict[str, Any]], result: dict[str, Any]) -> None:
    print(f"\n{preset}, {steps} steps per mode, workload {workload}")
    keys = [k for k in next(iter(summaries.values())) if k not in ("reward_curve", "final_reward_per_seed")]
    print("measure".ljust(24) + "".join(mode.rjust(14) for mode in summaries))
    for key in keys:
        print(key.ljust(24) + "".join(f"{s[key]:14.3f}" for s in summaries.values()))
    for mode, s in summaries.items():
        print(f"final reward per seed {mode}: " + " ".join(f"{r:.3f}" for r in s["final_reward_per_seed"]))
        print(f"reward curve {mode} (seed mean): " + " ".join(f"{r:.2f}" for r in s["reward_curve"]))
    for key, value in result.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
