"""vLLM on one GPU: memory residency of a hybrid engine, and CUDA IPC weight sync between two processes.

    python -m benchmarks.vllm_gpu_checks --workdir /tmp/vllm_checks --out results/vllm_gpu_checks.json

Needs CUDA and the vLLM CUDA build. Builds a random-init Qwen2 of the Qwen2.5-0.5B shape locally.

residency (one process, as in the hybrid placement): an FSDP2 actor with Adam state and a vLLM engine with
    sleep mode share the GPU; `torch.cuda.mem_get_info` is read after each move (engine sleep, actor
    offload, actor reload, engine wake + weight sync), and the synced engine is checked against the actor.
ipc (two Ray actors on the same GPU): a trainer process holding the HF model sends its weights to an
    engine process through `IpcStagingBuffers` (handles mapped once, one call per bucket); the engine's
    probe log-probs must then match the trainer's (bf16 tolerance) and differ from before the sync.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

import torch  # noqa: E402

from benchmarks.gpu_grpo_step import build_model  # noqa: E402
from benchmarks.learning import report  # noqa: E402

GIB = float(1 << 30)
ROLLOUT = {"name": "vllm", "gpu_memory_utilization": 0.35, "enable_sleep": True, "max_model_len": 512, "verify_sync": True}


def used_gib() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def rollout_config(model_path: str, **extra: Any) -> dict[str, Any]:
    from workers.config import actor_rollout_ref_config

    return actor_rollout_ref_config({"model": {"path": model_path}, "rollout": {**ROLLOUT, **extra}})


def residency(model_path: str) -> dict[str, Any]:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from workers.fsdp.backend import FSDPBackend
    from workers.fsdp.offload import Offloader
    from workers.rollout.hybrid import FSDPWeightSource, HybridRollout
    from workers.rollout.sampling import folder_token_ids, sampling_params

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    cfg = rollout_config(model_path)
    readings: dict[str, Any] = {"empty_gib": used_gib()}
    actor = FSDPBackend(AutoModelForCausalLM, cfg["model"], 0, optim_cfg=cfg["actor"]["optim"])

    def train_step() -> float:
        start = time.perf_counter()
        ids = torch.randint(0, 1000, (8, 512), device="cuda")
        actor.module(input_ids=ids).logits.float().mean().backward()
        actor.optimizer_step(1.0)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    train_step()  # creates the Adam state
    readings["actor_with_optimizer_gib"] = used_gib()
    offloader = Offloader(actor.module, actor.optimizer, actor.device, True, True)
    start = time.perf_counter()
    hybrid = HybridRollout(FSDPWeightSource(actor), cfg["rollout"], seed=0, rank=0)
    readings["engine_init_s"] = time.perf_counter() - start
    readings["actor_plus_engine_gib"] = used_gib()
    start = time.perf_counter()
    hybrid.engine.sleep()
    readings["engine_sleep_s"] = time.perf_counter() - start
    readings["engine_asleep_gib"] = used_gib()
    start = time.perf_counter()
    offloader.offload()
    readings["actor_offload_s"] = time.perf_counter() - start
    readings["actor_offloaded_engine_asleep_gib"] = used_gib()
    start = time.perf_counter()
    offloader.load(with_optimizer=True)
    readings["actor_reload_s"] = time.perf_counter() - start
    readings["actor_reloaded_gib"] = used_gib()
    readings["train_step_s"] = train_step()  # weights change: the engine must get them
    start = time.perf_counter()
    released = hybrid.engine.wake_up()
    readings["engine_wake_s"] = time.perf_counter() - start
    readings["engine_awake_gib"] = used_gib()
    sync = hybrid.sync(version=1, force=released)
    readings.update({k.replace("rollout/", "sync_"): v for k, v in sync.items()})
    offloader.offload()
    readings["actor_offloaded_engine_awake_gib"] = used_gib()
    params = sampling_params(cfg["rollout"] | {"response_length": 128}, {}, *folder_token_ids(model_path))
    prompts = torch.randint(0, 1000, (64, 64))
    ones = torch.ones_like(prompts)
    start = time.perf_counter()
    out = hybrid.engine.generate({"input_ids": prompts, "attention_mask": ones, "position_ids": ones.cumsum(-1) - 1}, params, 0, 0)
    readings["generate_64x128_s"] = time.perf_counter() - start
    readings["generated_tokens"] = int(out["response_mask"].sum())
    hybrid.engine.sleep()
    readings["engine_asleep_again_gib"] = used_gib()
    dist.destroy_process_group()
    return readings


def ipc(model_path: str) -> dict[str, Any]:
    import ray

    from single_controller.ray.local_cluster import init_local_ray, prepend_pythonpath

    init_local_ray(num_cpus=4, num_gpus=1, runtime_env={"env_vars": {"PYTHONPATH": prepend_pythonpath(os.getcwd())}})
    cfg = rollout_config(model_path, enable_sleep=False, gpu_memory_utilization=0.3)

    @ray.remote(num_gpus=0.5)
    class Engine:
        def __init__(self) -> None:
            from workers.rollout.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(model_path, cfg["rollout"], torch.bfloat16, torch.device("cuda", 0), seed=0)

        def open(self, handles: list) -> None:
            self.engine.open_ipc_buffers(handles)

        def load(self, index: int, layout: Any) -> int:
            return self.engine.load_ipc_bucket(index, layout)

        def finish(self) -> None:
            self.engine.after_weight_update()

        def probe(self, vocab_size: int) -> torch.Tensor:
            from workers.rollout.verify import probe_sequences

            return self.engine.prompt_log_probs(probe_sequences(vocab_size))

    @ray.remote(num_gpus=0.5)
    class Trainer:
        def __init__(self) -> None:
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).cuda()
            torch.manual_seed(1)
            with torch.no_grad():  # stands in for a training step: every weight changes
                for p in self.model.parameters():
                    p.add_(torch.randn_like(p) * 0.02)

        def sync(self, engine: Any, bucket_mb: int) -> dict[str, float]:
            from workers.rollout.weight_sync import IpcStagingBuffers, gathered_buckets, plan_model_buckets

            layouts = plan_model_buckets(self.model, torch.bfloat16, bucket_mb << 20)
            start = time.perf_counter()
            staging = IpcStagingBuffers(layouts, torch.device("cuda", 0))
            ray.get(engine.open.remote(staging.handles))
            setup_s = time.perf_counter() - start

            def deliver(index: int, layout: Any):
                ref = engine.load.remote(index, layout)
                return lambda: ray.get(ref)

            start = time.perf_counter()
            sent = staging.send(gathered_buckets(self.model, layouts), deliver)
            ray.get(engine.finish.remote())
            return {"ipc_setup_s": setup_s, "ipc_sync_s": time.perf_counter() - start, "ipc_gib": sent / GIB, "buckets": len(layouts)}

        def probe(self) -> torch.Tensor:
            from workers.rollout.verify import probe_sequences, trainer_log_probs

            return trainer_log_probs(self.model, probe_sequences(self.model.config.vocab_size), torch.device("cuda", 0))

    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    engine, trainer = Engine.remote(), Trainer.remote()
    before = ray.get(engine.probe.remote(vocab))
    result = ray.get(trainer.sync.remote(engine, 64))
    after, expected = ray.get(engine.probe.remote(vocab)), ray.get(trainer.probe.remote())
    result["ipc_probe_max_diff_vs_trainer"] = float((after - expected).abs().max())
    result["ipc_probe_mean_diff_vs_trainer"] = float((after - expected).abs().mean())
    result["ipc_probe_change_vs_before"] = float((after - before).abs().max())
    ray.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/vllm_checks")
    parser.add_argument("--out", default="results/vllm_gpu_checks.json")
    parser.add_argument("--parts", default="residency,ipc")
    args = parser.parse_args()
    model_path = Path(args.workdir) / "model"
    params = build_model(model_path)
    result: dict[str, Any] = {"params": params, "device": torch.cuda.get_device_name(0)}
    parts = args.parts.split(",")
    if "ipc" in parts:  # before residency: that part keeps a process group and engine in this process
        result.update(ipc(str(model_path)))
    if "residency" in parts:
        result.update(residency(str(model_path)))
    report(result, [k for k in result if isinstance(result[k], (int, float))], args.out)


if __name__ == "__main__":
    main()
