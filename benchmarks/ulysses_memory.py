"""GPU memory per phase of the FSDP actor at Ulysses k=1 and k=2 on 2 GPUs: the memory plan next to the peaks.

    python -m benchmarks.ulysses_memory [--tokens 327680] [--sequence-tokens 32768] [--sizes 1,2]
        [--workdir /tmp/ulysses_memory] [--out results/ulysses_memory] [--tiny]

A random-init Qwen2 of the Qwen2.5-1.5B shape (benchmarks/model_shapes.py, written once to the workdir by
benchmarks/random_model.py), bf16 compute with float32 master weights, gradient checkpointing, packed
sequences (flash-attention varlen on the GPU where it passes its check, else torch's varlen flash kernel:
workers/packing/attention.py), the reference KL loss. Each micro-batch is one packed row of `--tokens`
tokens: sequences of `--sequence-tokens` tokens (1024 prompt + the rest response, every response full
length). The batch is 2 micro-batches: at k=1 each GPU packs one of them (2 data-parallel ranks), at k=2 both
GPUs share each of them (one data-parallel group; each GPU holds half of every row). The actor's old log-probs,
the reference's log-probs and one PPO update run once per size, each size in a fresh process with its own
local Ray cluster.

Per phase it records the memory plan's estimate (trainer/memory_plan, for the same settings as a trainer
config) and the measured peaks of both GPUs (`gpu_used_peak_gib`: the device's highest use during the phase,
NVML, and `peak_allocated_gib`: the allocator's peak during the phase, reset at each phase's reading; the
workers here hold no vLLM engine, whose sleeping pool it would also count: workers/memory.py). A CUDA
out-of-memory error is caught and recorded with the phase it hit; the other size still runs. The default size
is where the plan says k=1 does not fit an 80 GiB GPU and k=2 does (at 1.5B with gradient checkpointing a
single 16K- or even 128K-token micro-batch fits at k=1).

`--tiny` runs a 2-layer model at a toy size on CPU (gloo), to check the script end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.model_shapes import QWEN2_0_5B, QWEN2_1_5B
from benchmarks.random_model import write_config, write_model_folder
from protocol import DataProto

PHASES = ("old_log_prob", "ref_log_prob", "update_actor")
PROMPT_TOKENS = 1024
DEFAULT_GPU_GIB = 80.0
TINY_SHAPE = dict(QWEN2_0_5B, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=256, vocab_size=256, tie_word_embeddings=False)
TINY_TOKENS, TINY_SEQUENCE_TOKENS, TINY_PROMPT_TOKENS = 96, 48, 16


def shape_of(args: argparse.Namespace) -> dict[str, Any]:
    shape = TINY_SHAPE if args.tiny else QWEN2_1_5B
    return dict(shape, max_position_embeddings=max(shape["max_position_embeddings"], args.sequence_tokens))


def prompt_tokens(args: argparse.Namespace) -> int:
    return TINY_PROMPT_TOKENS if args.tiny else PROMPT_TOKENS


def rows_per_micro_batch(args: argparse.Namespace) -> int:
    if args.tokens % args.sequence_tokens:
        raise SystemExit(f"error: --tokens={args.tokens} must be a multiple of --sequence-tokens={args.sequence_tokens}")
    return args.tokens // args.sequence_tokens


def trainer_overrides(args: argparse.Namespace, model_dir: Path, size: int) -> list[str]:
    """The trainer settings of the run: the plan is built from them and the workers get their actor section."""
    rows = rows_per_micro_batch(args)
    batch = 2 * rows  # two micro-batches: one per GPU at k=1, both shared by the 2 GPUs at k=2
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}", "trainer.n_gpus_per_node=2",
        f"data.max_prompt_length={prompt_tokens(args)}", f"data.max_response_length={args.sequence_tokens - prompt_tokens(args)}",
        f"data.train_batch_size={batch}", "actor_rollout_ref.rollout.n=1", f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={rows}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={rows}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={rows}",
        "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={size}", "trainer.total_training_steps=1",
        # This benchmark calls each phase itself, the old log-prob pass among them, and checks each against the plan.
        "actor_rollout_ref.actor.old_log_prob_pass=always",
    ]
    if args.tiny:
        overrides.append("trainer.device=cpu")
    return overrides


def rollout_batch(args: argparse.Namespace, vocab: int, seed: int = 0) -> DataProto:
    """Full-length sequences, the layout the rollout produces (no padding: every prompt and response is full)."""
    rows = 2 * rows_per_micro_batch(args)
    prompt, length = prompt_tokens(args), args.sequence_tokens
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (rows, length), generator=generator)
    mask = torch.ones_like(input_ids)
    responses = input_ids[:, prompt:]
    shape = responses.shape
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": mask, "position_ids": torch.arange(length).expand(rows, length).clone(),
        "responses": responses.clone(), "response_mask": torch.ones(shape, dtype=torch.long),
        "advantages": torch.randn(shape, generator=generator),
    })


# ---- one size, in its own process ------------------------------------------------------------------------


def is_out_of_memory(error: BaseException) -> bool:
    # The group's error quotes the worker's exception (torch.OutOfMemoryError: CUDA out of memory ...).
    return "out of memory" in f"{type(error).__name__}: {error}".lower() or "OutOfMemoryError" in str(error)


def run_size(args: argparse.Namespace, model_dir: Path, size: int) -> dict[str, Any]:
    """Old log-probs, reference log-probs and one update at Ulysses size `size`; per phase the peaks of
    both GPUs, or the out-of-memory error and the phase it hit."""
    from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from trainer.config_loader import load_config
    from trainer.role_groups import actor_worker_config, use_gpu
    from trainer.run_setup import init_ray
    from workers.actor import ActorRolloutRefWorker

    cfg = load_config(trainer_overrides(args, model_dir, size))
    init_ray(cfg)
    pool = RayResourcePool([2], use_gpu=use_gpu(cfg), name_prefix=f"ulysses_k{size}_")
    worker = RayClassWithInitArgs(ActorRolloutRefWorker, config=actor_worker_config(cfg), role="actor_rollout_ref")
    result: dict[str, Any] = {"size": size, "out_of_memory": None, "error": None, "phases": {}}
    group = None
    phase = "init"
    start = time.perf_counter()  # the init phase: the workers' start and the models' load
    try:
        # A call that hangs (e.g. a collective after the other rank failed) fails before the parent's timeout.
        group = RayWorkerGroup(pool, worker, name_prefix=f"ulysses_k{size}", call_timeout_s=0.8 * args.timeout_s)
        group.init_model()
        data = rollout_batch(args, shape_of(args)["vocab_size"])
        calls = {"old_log_prob": group.compute_log_prob, "ref_log_prob": group.compute_ref_log_prob,
                 "update_actor": group.update_actor}
        for phase in ("init", *PHASES):
            if phase != "init":
                start = time.perf_counter()
                output = calls[phase](data)
                if isinstance(output, DataProto):  # the update reads the log-probs the passes before it made
                    data.batch.update({key: output.batch[key] for key in ("old_log_probs", "ref_log_prob") if key in output.batch})
            readings = group.pop_step_metrics()  # one dict per GPU
            result["phases"][phase] = phase_reading(readings, phase, time.perf_counter() - start)
    except Exception as error:  # noqa: BLE001 - an out-of-memory size is a result; the other size still runs
        if not is_out_of_memory(error):
            result["error"] = f"{phase}: {type(error).__name__}: {str(error)[-2000:]}"
        else:
            result["out_of_memory"] = phase
            result["out_of_memory_message"] = str(error)[-1000:]
    finally:
        if group is not None:
            group.kill()
        pool.release()
    return result


def phase_reading(readings: list[dict[str, float]], phase: str, seconds: float) -> dict[str, float]:
    """The highest of each memory reading over the GPUs (the plan is per GPU), and the phase's time."""
    reading = {"seconds": seconds}
    for key in ("gpu_used_peak_gib", "peak_allocated_gib", "gpu_used_gib", "rss_gib"):
        values = [r[f"memory/{phase}/{key}"] for r in readings if f"memory/{phase}/{key}" in r]
        if values:
            reading[key] = max(values)
    return reading


# ---- the driver: the plan, one child per size, the table ------------------------------------------------


def plan_rows(args: argparse.Namespace, model_dir: Path, size: int, gpu_gib: float) -> dict[str, Any]:
    from trainer.config_loader import load_config
    from trainer.memory_plan import GIB, build_plan, render_plan

    plan = build_plan(load_config(trainer_overrides(args, model_dir, size)), int(gpu_gib * GIB))
    phases = {phase: plan.row(phase).total / GIB for phase in ("init", *PHASES) if plan.row(phase) is not None}
    parts = {phase: {c: v / GIB for c, v in plan.row(phase).parts.items()} for phase in PHASES}
    trained = max(phases[p] for p in PHASES)
    return {"phases": phases, "parts": parts, "fits": trained <= gpu_gib, "text": render_plan(plan)}


def gpu_gib_of(args: argparse.Namespace) -> float:
    if args.gpu_memory_gib is not None:
        return args.gpu_memory_gib
    from trainer.memory_plan.gpu import detect_gpu_bytes

    # Through NVML, not torch: a CUDA context in this process would sit on GPU 0 during the measurements.
    detected = None if args.tiny else detect_gpu_bytes()
    return detected / (1 << 30) if detected else DEFAULT_GPU_GIB


def run_child(args: argparse.Namespace, size: int, out: Path) -> dict[str, Any]:
    """`run_size` in a fresh process (its own Ray cluster and CUDA contexts); a crash is recorded, not raised."""
    result_file = out / f"k{size}_run.json"
    command = [sys.executable, "-m", "benchmarks.ulysses_memory", "--child", str(size), "--out", str(out),
               "--workdir", args.workdir, "--timeout-s", str(args.timeout_s), "--tokens", str(args.tokens),
               "--sequence-tokens", str(args.sequence_tokens),
               *(["--tiny"] if args.tiny else [])]
    start = time.perf_counter()
    # Its own session: on a timeout the whole process group goes (the child's local Ray cluster and workers
    # with it), so the next size starts on free GPUs.
    child = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1], start_new_session=True,
                             env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    try:
        code = child.wait(timeout=args.timeout_s)
        failure = None if code == 0 else f"child exited with {code}"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        failure = f"child ran past --timeout-s={args.timeout_s:.0f}"
    if failure or not result_file.exists():
        return {"size": size, "out_of_memory": None, "error": failure or "no result file", "phases": {}}
    result = json.loads(result_file.read_text())
    result["wall_s"] = time.perf_counter() - start
    return result


def print_table(results: list[dict[str, Any]], gpu_gib: float) -> None:
    print(f"\nper GPU, GiB (GPU {gpu_gib:.1f} GiB); plan = the memory plan's estimate; peak = the device's highest use "
          "(NVML), alloc = the allocator's peak in the phase, rss = a worker's host memory at the phase's end: the higher of the 2")
    print(f"  {'k':>2}  {'phase':<14}{'plan':>8}{'peak':>8}{'alloc':>8}{'rss':>8}{'time s':>9}  note")
    nan = float("nan")
    for result in results:
        plan = result["plan"]
        for phase in ("init", *PHASES):
            measured = result["phases"].get(phase, {})
            note = ""
            if result["out_of_memory"] == phase:
                note = "out of memory"
            elif result["error"] and not measured:
                note = "not run"
            columns = [plan["phases"].get(phase, nan)]
            columns += [measured.get(key, nan) for key in ("gpu_used_peak_gib", "peak_allocated_gib", "rss_gib")]
            print(f"  {result['size']:>2}  {phase:<14}" + "".join(f"{c:8.1f}" for c in columns)
                  + f"{measured.get('seconds', nan):9.1f}  {note}")
        verdict = "fits" if plan["fits"] else "does not fit"
        ran = "ran out of memory" if result["out_of_memory"] else ("failed: " + result["error"][:200] if result["error"] else "ran")
        print(f"      plan: {verdict}; measured: {ran}")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=None, help="tokens of one packed micro-batch row (default 327680; --tiny 96)")
    parser.add_argument("--sequence-tokens", type=int, default=None, help="tokens of each sequence in it (default 32768; --tiny 48)")
    parser.add_argument("--sizes", default="1,2", help="Ulysses sizes to run, each in a fresh process")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="the plan's GPU size (default: this GPU's, else 80)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model at a toy size on CPU (gloo): checks the script")
    parser.add_argument("--timeout-s", type=float, default=250.0, help="per size (both sizes fit a 10-minute slot)")
    parser.add_argument("--workdir", default="/tmp/ulysses_memory")
    parser.add_argument("--out", default="results/ulysses_memory")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.tokens = args.tokens or (TINY_TOKENS if args.tiny else 327680)
    args.sequence_tokens = args.sequence_tokens or (TINY_SEQUENCE_TOKENS if args.tiny else 32768)
    rows_per_micro_batch(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.workdir) / ("tiny" if args.tiny else "qwen2_1_5b") / "model"
    if args.child is not None:
        result = run_size(args, model_dir, args.child)
        (out / f"k{args.child}_run.json").write_text(json.dumps(result, indent=2))
        return [result]

    gpu_gib = gpu_gib_of(args)
    write_config(model_dir, shape_of(args))  # the config follows --sequence-tokens; the weights are written once
    if not (model_dir / "model.safetensors.index.json").exists():
        print(f"model folder: {write_model_folder(model_dir, shape_of(args)) / 1e9:.2f} B parameters in {model_dir}")
    results = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        plan = plan_rows(args, model_dir, size, gpu_gib)
        print(f"\nk={size}\n{plan['text']}")
        results.append({**run_child(args, size, out), "plan": plan})
        summary = {"tokens": args.tokens, "sequence_tokens": args.sequence_tokens, "gpu_gib": gpu_gib, "tiny": args.tiny,
                   "results": results}
        (out / "ulysses_memory.json").write_text(json.dumps(summary, indent=2))  # after each size
    print_table(results, gpu_gib)
    print(f"wrote {out / 'ulysses_memory.json'}")
    return results


if __name__ == "__main__":
    main()
