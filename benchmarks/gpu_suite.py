"""Every GPU path a user can choose, at the smallest size that exercises it, in one command per machine size.

    python -m benchmarks.gpu_suite --part one [--jobs 3] [--workdir /tmp/gpu_suite] [--out results/gpu_suite_one.json]
    python -m benchmarks.gpu_suite --part two [--jobs 3] ...
    python -m benchmarks.gpu_suite --dry-run [--part all]      # the cases and their commands; runs nothing
    python -m benchmarks.gpu_suite --part one --only vllm_hybrid lora_vllm_ref_first

Part `one` wants exactly one visible GPU (`CUDA_VISIBLE_DEVICES=0`), part `two` exactly two. Each case runs its
commands as a user types them (`python -m trainer.main ...`, the engine examples) in an empty folder of its
own, on the embedded tiny model (bf16 on the GPU, CUDA graphs in vLLM, real vLLM, NCCL between GPUs), then
checks what the run logged: steps reached, losses finite, every weight sync verified, reward rising where the
case learns, a resumed run starting after its checkpoint (benchmarks/suite_runner.py). Cases run side by side
(`--jobs`, default 3): the vLLM cases give the engine a fixed 2 GiB KV cache
(`rollout.kv_cache_gib`), so no start-up measurement of free memory is upset by a neighbour; the engine examples,
which do measure, run alone at the end, and a case vLLM still refused for that reason runs once more. Prints a
table; `--out` gets the JSON with each case's commands, result, first error line, steady step time and check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.suite_runner import Case, CaseResult, ExampleCheck, RunCheck, run_case

MAIN = ("-m", "trainer.main")
# Every training case except the README's own job: no validation, a logger that needs nothing, the run's folder
# in the case's folder.
QUIET = (
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.logger=[console,jsonl]",
    "trainer.default_local_dir=run",
)
# A fixed KV cache: vLLM then skips its start-up measurement of the GPU's free memory, which the cases beside it
# upset; a tenth of the GPU is what its start asks to be free.
VLLM = (
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.kv_cache_gib=2",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.1",
)
VERIFY = ("actor_rollout_ref.rollout.verify_sync=true",)
OFFLOAD = (
    "actor_rollout_ref.actor.fsdp_config.param_offload=true", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"
)
LORA = (
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.actor.optim.lr=5e-3",
)
LIGER = ("actor_rollout_ref.model.use_liger=true", "critic.model.use_liger=true")
ALWAYS = ("actor_rollout_ref.actor.old_log_prob_pass=always",)
TINY_MOE = "actor_rollout_ref.model.path=outputs/tiny_moe"
MOE = (TINY_MOE, "actor_rollout_ref.actor.router_aux_loss_coef=0.001")
PPO_FINITE = ("actor/pg_loss", "critic/vf_loss")
CRITIC_OFFLOAD = ("critic.model.fsdp_config.param_offload=true", "critic.model.fsdp_config.optimizer_offload=true")


def steps(count: int) -> str:
    return f"trainer.total_training_steps={count}"


def _train(*overrides: str) -> tuple[str, ...]:
    return (*MAIN, *QUIET, *overrides)


def _lora_case(name: str, shared: bool, offload: bool, always: bool, verify: bool, path: str) -> Case:
    overrides = [*VLLM, *LORA, f"actor_rollout_ref.rollout.share_base_weights={str(shared).lower()}", steps(12)]
    overrides += [*OFFLOAD] if offload else []
    overrides += [*ALWAYS] if always else []
    overrides += [*VERIFY] if verify else []
    return Case(name, "one", path, (_train(*overrides),), RunCheck(12, synced=verify, offloaded=offload))


def one_gpu_cases() -> list[Case]:
    # LoRA: base shared with the engine or not x actor offload on or off x old log-prob pass auto or always, in
    # four runs that hold every pair of those settings once (a two-level orthogonal array).
    lora = [
        _lora_case(
            "lora_vllm_ref_first",
            True,
            True,
            False,
            False,
            "LoRA, vLLM hybrid, base shared, offload, pass skipped: the reference is the actor's first forward",
        ),
        _lora_case(
            "lora_unshared", False, False, False, True, "LoRA, vLLM hybrid, base not shared, no offload, pass skipped"
        ),
        _lora_case(
            "lora_shared_always", True, False, True, True, "LoRA, vLLM hybrid, base shared, no offload, pass always"
        ),
        _lora_case(
            "lora_unshared_offload_always",
            False,
            True,
            True,
            False,
            "LoRA, vLLM hybrid, base not shared, offload, pass always",
        ),
    ]
    resume = ("trainer.save_freq=2", *VLLM, *VERIFY, "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")
    # Longest first (measured on an H200), so the cases running side by side end close together. The engine
    # examples size their vLLM engines by measuring the GPU's free memory, which a neighbour upsets: they run alone.
    return [
        Case(
            "checkpoint_resume",
            "one",
            "checkpoint saved at step 4 (optimizer offloaded), resumed to step 6, vLLM",
            (_train(*resume, steps(4)), _train(*resume, steps(6))),
            RunCheck(6, synced=True, resumed_after=4),
        ),
        lora[0],
        Case(
            "vllm_hybrid",
            "one",
            "vLLM hybrid engine (CUDA graphs, sleep mode), CUDA IPC sync verified",
            (_train(*VLLM, *VERIFY, steps(30)),),
            RunCheck(30, reward_rises_by=0.2, synced=True),
        ),
        Case(
            "moe_vllm_hybrid",
            "one",
            "the tiny mixture of experts (trainer/tiny_moe.py), router load-balancing loss, vLLM hybrid engine with "
            "its fused-MoE kernels, every sync of the experts verified",
            (_train(*MOE, *VLLM, *VERIFY, steps(30)),),
            RunCheck(30, finite=("actor/router_aux_loss",), reward_rises_by=0.2, synced=True),
        ),
        Case(
            "megatron_moe_vllm_hybrid",
            "one",
            "Megatron actor on the tiny mixture of experts (megatron-core's MoE layer: router, all-to-all token "
            "dispatcher, experts), vLLM hybrid engine, every sync of the experts verified",
            (_train(TINY_MOE, "actor_rollout_ref.actor.strategy=megatron", *VLLM, *VERIFY, steps(12)),),
            RunCheck(12, synced=True),
        ),
        Case(
            "dapo",
            "one",
            "DAPO (dynamic sampling, clip-higher, overlong penalty), vLLM hybrid",
            (_train("algorithm=dapo", *VLLM, steps(10)),),
            RunCheck(10),
        ),
        *lora[1:],
        Case(
            "readme_default",
            "one",
            "the README's main job, no overrides (GPU count from the node, HF rollout)",
            (MAIN,),
            RunCheck(64, last_reward_at_least=0.9),  # one epoch of the synthetic task (trainer.total_epochs=1)
            timeout_s=240,
        ),
        Case(
            "full_offload",
            "one",
            "full fine-tune, actor parameters and optimizer offloaded, vLLM hybrid",
            (_train(*VLLM, *VERIFY, *OFFLOAD, steps(10)),),
            RunCheck(10, synced=True, offloaded=True),
        ),
        Case(
            "ppo_critic_offload",
            "one",
            "PPO, actor and critic parameters and optimizer offloaded, vLLM hybrid (the critic's state leaves "
            "while the actor and the engine compute)",
            (_train("algorithm=ppo", *VLLM, *OFFLOAD, *CRITIC_OFFLOAD, steps(10)),),
            RunCheck(10, finite=(*PPO_FINITE, "offload/values/d2h_gib", "offload/update_critic/h2d_gib"),
                     offloaded=True),
        ),
        Case(
            "hf_padded_checkpointing",
            "one",
            "HF rollout, padded forwards, gradient checkpointing",
            (
                _train(
                    "actor_rollout_ref.rollout.name=hf",
                    "actor_rollout_ref.model.use_remove_padding=false",
                    "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                    steps(30),
                ),
            ),
            RunCheck(30, reward_rises_by=0.2),
        ),
        Case(
            "image_task",
            "one",
            "the image task on the tiny vision-language model (task=visual_colors)",
            (_train("task=visual_colors", steps(10)),),
            RunCheck(10),
        ),
        Case(
            "ppo_critic",
            "one",
            "PPO with a critic (GAE), HF rollout, Liger's kernels in the actor, reference and critic",
            (_train("algorithm=ppo", *LIGER, steps(30)),),
            RunCheck(30, finite=PPO_FINITE, reward_rises_by=0.2),
        ),
        Case(
            "engine_examples",
            "one",
            "the engine-API examples: quick start, LoRA, VLM (colocated, CUDA IPC)",
            (("-m", "benchmarks.engine_examples", "--workdir", ".", "--out", "examples.json"),),
            ExampleCheck(("quickstart (colocated)", "lora (colocated)", "vlm")),
            alone=True,
        ),
    ]


def two_gpu_cases() -> list[Case]:
    separate = (
        "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.async_training=true",
        "trainer.n_gpus_per_node=1",
    )
    megatron = (
        "actor_rollout_ref.model.path=model_kv2",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    )
    return [
        Case(
            "fsdp_two_gpus",
            "two",
            "FSDP over both GPUs (n_gpus_per_node from the node), vLLM hybrid on each",
            (_train(*VLLM, *VERIFY, steps(20)),),
            RunCheck(20, reward_rises_by=0.2, synced=True),
        ),
        Case(
            "hybrid_tp2",
            "two",
            "verl's layout: both FSDP ranks share one hybrid vLLM engine of tensor parallel 2",
            (_train(*VLLM, *VERIFY, "actor_rollout_ref.rollout.tensor_model_parallel_size=2", steps(20)),),
            RunCheck(20, reward_rises_by=0.2, synced=True),
        ),
        Case(
            "ulysses_two",
            "two",
            "PPO with Ulysses sequence parallel k=2 (actor, reference, critic)",
            (
                _train(
                    "algorithm=ppo",
                    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                    "critic.ulysses_sequence_parallel_size=2",
                    steps(10),
                ),
            ),
            RunCheck(10, finite=PPO_FINITE),
        ),
        Case(
            "separate_async_nccl",
            "two",
            "vLLM engine on its own GPU, NCCL broadcast, rollout.async_training=true",
            (_train(*VLLM, *VERIFY, *separate, steps(12)),),
            RunCheck(12, synced=True),
        ),
        Case(
            "megatron_tp2",
            "two",
            "Megatron actor, tensor parallel 2, vLLM hybrid (tiny model with 2 KV heads)",
            (
                ("-m", "trainer.tiny_model", "model_kv2", "--kv-heads", "2"),
                _train(*VLLM, *VERIFY, *megatron, steps(10)),
            ),
            RunCheck(10, synced=True),
        ),
        Case(
            "megatron_moe_ep2",
            "two",
            "Megatron actor on the tiny mixture of experts, expert parallel 2 (each GPU holds half of every layer's "
            "experts; NCCL all-to-all token dispatch), vLLM hybrid on each GPU, every sync of the experts verified",
            (
                _train(
                    TINY_MOE,
                    *VLLM,
                    *VERIFY,
                    "actor_rollout_ref.actor.strategy=megatron",
                    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
                    steps(10),
                ),
            ),
            RunCheck(10, synced=True),
        ),
        Case(
            "engine_quickstart_two_gpus",
            "two",
            "engine-API quick start, train engine colocated and on its own GPU (NCCL)",
            (("-m", "benchmarks.engine_examples", "--only", "quickstart", "--workdir", ".", "--out", "examples.json"),),
            ExampleCheck(("quickstart (colocated)", "quickstart (own GPU)")),
            alone=True,
        ),
    ]


def cases(part: str) -> list[Case]:
    chosen = {"one": one_gpu_cases, "two": two_gpu_cases}
    return [case for name, build in chosen.items() if part in (name, "all") for case in build()]


def visible_gpus() -> int:
    """The GPUs this process shows, counted as the trainer counts them (NVML: no CUDA context here)."""
    from trainer.memory_plan.gpu import detect_gpu_count

    return detect_gpu_count()


def machine() -> dict[str, Any]:
    import torch

    from trainer.memory_plan.gpu import detect_gpu_bytes, detect_gpu_name

    gpu_bytes = detect_gpu_bytes()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpus": visible_gpus(),
        "gpu": detect_gpu_name(),
        "gpu_memory_gib": round(gpu_bytes / 2**30, 1) if gpu_bytes else None,
    }
    for package in ("vllm", "transformers", "ray", "megatron.core"):
        try:
            info[package] = __import__(package, fromlist=["__version__"]).__version__
        except ImportError:
            info[package] = None
    return info


def commit() -> str:
    """This tree's commit: SUITE_COMMIT when set (a copy of the tree without its .git), else git's."""
    if os.environ.get("SUITE_COMMIT"):
        return os.environ["SUITE_COMMIT"]
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() or "unknown"


def table(results: list[CaseResult]) -> str:
    lines = [f"{'case':30} {'part':4} {'result':6} {'wall s':>7} {'step s':>7}  check / error"]
    for r in results:
        step = f"{r.steady_step_s:.2f}" if r.steady_step_s is not None else "-"
        said = r.detail if r.passed else (r.error or "")
        lines.append(f"{r.name:30} {r.part:4} {'pass' if r.passed else 'FAIL':6} {r.wall_s:7.1f} {step:>7}  {said}")
    passed = sum(r.passed for r in results)
    lines.append(f"{passed}/{len(results)} cases passed")
    return "\n".join(lines)


def dry_run(selected: list[Case]) -> str:
    lines = []
    for case in selected:
        lines.append(f"{case.name} [{case.part}]{' (alone)' if case.alone else ''} {case.path}")
        lines += [f"    {line}" for line in case.command_lines()]
        lines.append(f"    check: {case.check.describe()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[CaseResult]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("one", "two", "all"), default="one")
    parser.add_argument("--only", nargs="+", default=None, help="run these cases only")
    parser.add_argument("--jobs", type=int, default=None, help="cases at a time (default 3)")
    parser.add_argument("--workdir", default="/tmp/gpu_suite")
    parser.add_argument("--out", default=None, help="JSON of the results (default results/gpu_suite_<part>.json)")
    parser.add_argument("--dry-run", action="store_true", help="list the cases and their commands; run nothing")
    args = parser.parse_args(argv)
    selected = cases(args.part)
    if args.only:
        unknown = sorted(set(args.only) - {c.name for c in selected})
        if unknown:
            parser.error(f"--only: no case {unknown} in part {args.part}; cases: {', '.join(c.name for c in selected)}")
        selected = [c for c in selected if c.name in args.only]
    if args.dry_run:
        print(dry_run(selected))
        return []
    if args.part == "all":
        parser.error("--part all is for --dry-run; run part one and part two on machines of their sizes")
    wanted = 1 if args.part == "one" else 2
    if visible_gpus() != wanted:
        parser.error(
            f"part {args.part} runs on exactly {wanted} visible GPU(s); this process sees {visible_gpus()} "
            f"(set CUDA_VISIBLE_DEVICES, e.g. {'0' if wanted == 1 else '0,1'})"
        )
    jobs = args.jobs or 3
    root = Path(args.workdir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    report = Report(Path(args.out or f"results/gpu_suite_{args.part}.json"), args.part, jobs)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda case: report.add(run_case(case, root)), [c for c in selected if not c.alone]))
    results += [report.add(run_case(case, root)) for case in selected if case.alone]
    print(table(results))
    return results


class Report:
    """The JSON of a suite run, rewritten as each case ends: a run stopped from outside keeps what finished."""

    def __init__(self, out: Path, part: str, jobs: int) -> None:
        self.out, self.started = out, time.perf_counter()
        self.header = {
            "part": part,
            "commit": commit(),
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine(),
            "jobs": jobs,
        }
        self.results: list[CaseResult] = []
        self.lock = threading.Lock()
        out.parent.mkdir(parents=True, exist_ok=True)

    def add(self, result: CaseResult) -> CaseResult:
        state = "pass" if result.passed else f"FAIL: {result.error}"
        print(f"[gpu_suite] {result.name}: {state} ({result.wall_s:.0f} s)", flush=True)
        with self.lock:
            self.results.append(result)
            self.out.write_text(
                json.dumps(
                    {
                        **self.header,
                        "wall_s": round(time.perf_counter() - self.started, 1),
                        "passed": sum(r.passed for r in self.results),
                        "cases": [asdict(r) for r in self.results],
                    },
                    indent=2,
                )
            )
        return result


if __name__ == "__main__":
    results = main()
    raise SystemExit(0 if all(r.passed for r in results) else 1)
