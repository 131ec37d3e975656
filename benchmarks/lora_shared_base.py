"""A LoRA actor and its hybrid vLLM engine on one GPU with one copy of the base (rollout.share_base_weights), next
to the same pair with two copies: where the actor's base lives, device memory after each move, the engine's
sleep and wake (KV cache only when shared, vLLM's level 1 otherwise) and the checks that generation still
matches the trainer after them.

    python -m benchmarks.lora_shared_base [--size 0.5B|3B|7B] [--model FOLDER] [--lora-rank 64]
        [--gpu-memory-utilization 0.5] [--workdir /tmp/lora_shared_base] [--out results/lora_shared_base.json]

Each mode runs in a child process of its own (vLLM's sleep-mode allocator is one per process). Per mode:
`used_gib` (the whole device, NVML's view) after the actor loaded, after the engine started, after the base was
shared, asleep and awake; the seconds of the first adapter sync, of sleep and wake, of a generate before and
after a sleep; the probe check of engine against trainer log-probs (bf16 tolerance) before and after. With
sharing also: the fraction of the actor's base bytes that lie inside one of the engine's parameter storages
(read from vLLM's own model, not the sharing code), and a write through the actor's tensor seen by the engine's.
`--size tiny` runs on CPU (vLLM's CPU build: no sleep mode) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.model_shapes import QWEN2_0_5B
from benchmarks.random_model import write_model_folder
from benchmarks.scale_step import SHAPES as SCALE_SHAPES

GIB = float(1 << 30)
SHAPES = {"0.5B": QWEN2_0_5B, **SCALE_SHAPES}
MODES = ("shared", "own")


def used_gib(device: torch.device) -> float:
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def base_inside_engine(shared: Any, engine: Any) -> float:
    """Fraction of the actor's base bytes whose shard lies inside one of the engine's parameter storages."""
    from workers.fsdp.shared_storage import local_shard

    def ranges(worker: Any) -> list[tuple[int, int]]:
        model = worker.model_runner.get_model()
        return [(p.untyped_storage().data_ptr(), p.untyped_storage().data_ptr() + p.untyped_storage().nbytes())
                for p in model.parameters()]

    (storages,) = engine.llm.collective_rpc(ranges)
    inside = total = 0
    for param in shared.params.values():
        local = local_shard(param)
        start, nbytes = local.data_ptr(), local.numel() * local.element_size()
        total += nbytes
        inside += nbytes if any(lo <= start and start + nbytes <= hi for lo, hi in storages) else 0
    return inside / total


def write_through(shared: Any, engine: Any) -> bool:
    """Double the actor's shard of the final norm; the engine's tensor must show it; then halve it back."""
    from workers.fsdp.shared_storage import local_shard

    local = local_shard(shared.params["model.norm.weight"])
    (engine_norm,) = engine.llm.collective_rpc(lambda worker: worker.model_runner.get_model().get_parameter("model.norm.weight"))
    before = engine_norm.detach().clone()
    with torch.no_grad():
        local.mul_(2.0)
        seen = torch.equal(engine_norm, 2 * before)
        local.mul_(0.5)
    return seen and torch.equal(engine_norm, before)


def run_mode(mode: str, model: str, lora_rank: int, utilization: float) -> dict[str, Any]:
    """One mode in this process (called in a child)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from workers.config import actor_rollout_ref_config
    from workers.fsdp.backend import FSDPBackend
    from workers.fsdp.shared_base import SharedBase
    from workers.rollout.hybrid import FSDPWeightSource, HybridRollout
    from workers.rollout.sampling import folder_token_ids, sampling_params

    on_gpu = torch.cuda.is_available()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29547")
    if on_gpu:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=0, world_size=1)
    cfg = actor_rollout_ref_config({
        "model": {"path": model, "lora_rank": lora_rank, "lora_alpha": 2 * lora_rank},
        "rollout": {"name": "vllm", "gpu_memory_utilization": utilization, "enable_sleep": True, "max_model_len": 512,
                    "verify_sync": True, "share_base_weights": mode == "shared", "cpu_kv_cache_mb": 64},
    })
    actor = FSDPBackend(AutoModelForCausalLM, cfg["model"], 0, optim_cfg=cfg["actor"]["optim"])
    device = actor.device
    out: dict[str, Any] = {"mode": mode, "device": torch.cuda.get_device_name() if on_gpu else "cpu"}
    out["actor_loaded_gib"] = used_gib(device)
    shared = SharedBase(actor.module) if mode == "shared" else None
    hybrid, out["engine_start_s"] = timed(lambda: HybridRollout(FSDPWeightSource(actor), cfg["rollout"], seed=0, rank=0, shares_weights=shared is not None))
    out["engine_started_gib"] = used_gib(device)
    if shared is not None:
        report, out["share_s"] = timed(lambda: shared.attach(hybrid.engine.checkpoint_views()))
        out.update(report.metrics(), unshared=report.unshared, shared_gib=used_gib(device))
        out["base_inside_engine_fraction"] = base_inside_engine(shared, hybrid.engine)
        out["write_through_seen"] = write_through(shared, hybrid.engine)
    sync, out["first_sync_s"] = timed(lambda: hybrid.sync(version=0))
    out["sync_logprob_max_diff"] = sync.get("rollout/sync_logprob_max_diff")
    params = sampling_params(cfg["rollout"] | {"response_length": 128}, {}, *folder_token_ids(model))
    prompts = torch.randint(3, 90, (64, 64))
    ones = torch.ones_like(prompts)
    batch = {"input_ids": prompts, "attention_mask": ones, "position_ids": ones.cumsum(-1) - 1}
    _, out["generate_s"] = timed(lambda: hybrid.engine.generate(batch, params, 0, 0))
    out["awake_gib"] = used_gib(device)
    _, out["sleep_s"] = timed(hybrid.engine.sleep)
    out["asleep_gib"] = used_gib(device)
    ids = torch.randint(3, 90, (8, 256), device=device)
    _, out["train_step_s"] = timed(lambda: (actor.module(input_ids=ids).logits.float().mean().backward(), actor.optimizer_step(1.0)))
    out["after_train_step_gib"] = used_gib(device)
    released, out["wake_s"] = timed(hybrid.engine.wake_up)
    out["wake_needs_sync"] = released
    out["woken_gib"] = used_gib(device)
    sync, out["sync_after_wake_s"] = timed(lambda: hybrid.sync(version=1, force=released))
    out["sync_after_wake_logprob_max_diff"] = sync.get("rollout/sync_logprob_max_diff")
    _, out["generate_after_wake_s"] = timed(lambda: hybrid.engine.generate(batch, params, 1, 0))
    probe = hybrid.verify("after a sleep and a training step")  # raises when the engine no longer matches
    out.update({key.replace("rollout/sync", "probe_after_wake"): value for key, value in probe.items()})
    dist.destroy_process_group()
    return out


def child(mode: str, args: argparse.Namespace, model: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.lora_shared_base", "--child", mode, "--model", model,
               "--lora-rank", str(args.lora_rank), "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1])
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"mode": mode, "failed": done.returncode, "stderr_tail": done.stderr[-4000:]}
    return json.loads(lines[-1][len("RESULT "):])


def print_table(results: list[dict[str, Any]]) -> None:
    keys = sorted({k for r in results for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    print(f"\n{'':36}" + "".join(f"{r['mode']:>14}" for r in results))
    for key in keys:
        print(f"{key:36}" + "".join(f"{r.get(key, float('nan')):14.3f}" for r in results))
    for r in results:
        for key in ("write_through_seen", "wake_needs_sync", "unshared", "failed", "stderr_tail"):
            if key in r:
                print(f"{r['mode']}: {key} = {r[key]}")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="0.5B", choices=list(SHAPES))
    parser.add_argument("--model", default=None, help="an existing model folder (e.g. scale_step's /tmp/scale_step/7B/model)")
    parser.add_argument("--lora-rank", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--workdir", default="/tmp/lora_shared_base")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", choices=MODES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    if args.child:
        result = run_mode(args.child, args.model, args.lora_rank, args.gpu_memory_utilization)
        print("RESULT " + json.dumps(result, default=str))
        return [result]
    model = args.model
    if model is None:
        model = str(Path(args.workdir) / args.size / "model")
        if not (Path(model) / "config.json").exists():
            write_model_folder(model, SHAPES[args.size])
    results = [child(mode, args, model) for mode in MODES]
    print_table(results)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))
    return results


if __name__ == "__main__":
    main()
