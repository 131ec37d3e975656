"""Separate placement, synchronous vs one-step-off generation: GRPO step time with rollout.staleness 0 and 1.

    python -m benchmarks.e2e_staleness [--size 0.5B] [--steps 6] [--out results/e2e_staleness.json] [overrides...]

The `benchmarks/e2e_step.py` workload (random-init Qwen2, arithmetic task, 16 prompts x 8 samples x 256 new
tokens, reference model and KL loss) with the vLLM engine in its own pool: on a 2-GPU machine the actor runs
on one GPU and the engine on the other, weights go over NCCL between steps. Both runs in one process, back
to back. Steady state = the mean over steps 3..N (the staleness-1 run's step 2 is its first overlapped one).

Targets (issue 18): staleness-1 step <= 0.6 x staleness-0 step, and <= (max(generate, train) + sync) x 1.05,
where generate / train / sync are the staleness-0 run's own phases (train = every phase after generation).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.e2e_step import SHAPES, run_size

SEPARATE = ["actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.num_engines=1"]
OVERLAP_TARGET, BOUND_SLACK = 0.6, 1.05


def steady(history: list[dict[str, float]], key: str, first: int = 3) -> float:
    values = [r[key] for r in history if r["step"] >= first and key in r]
    return sum(values) / len(values) if values else float("nan")


def phases(history: list[dict[str, float]]) -> dict[str, float]:
    step = steady(history, "timing/step_s")
    generate = steady(history, "timing/generate_s")
    sync = steady(history, "timing/sync_weights_s")
    return {
        "step_s": step,
        "generate_s": generate,
        "sync_s": sync,
        "train_s": step - generate - sync,  # reward, log-probs, advantages, update
        "wait_rollout_s": steady(history, "timing/wait_rollout_s"),
        "toolkit_share": steady(history, "overhead/toolkit_share"),
        "staleness": steady(history, "rollout/staleness"),
        "reward_mean": steady(history, "reward/mean"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="0.5B", choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs")
    parser.add_argument("--workdir", default="/tmp/e2e_staleness")
    parser.add_argument("--out", default="results/e2e_staleness.json")
    args, extra = parser.parse_known_args()
    if args.steps < 3:
        parser.error("--steps must be >= 3 (the steady state starts at step 3)")
    runs: dict[int, dict[str, Any]] = {}
    for staleness in (0, 1):
        overrides = [*SEPARATE, f"actor_rollout_ref.rollout.staleness={staleness}", *extra]
        result = run_size(args.size, Path(args.workdir) / f"staleness{staleness}", args.steps, "vllm", args.eager, overrides)
        runs[staleness] = {"phases": phases(result["history"]), **result}
    sync, off = runs[0]["phases"], runs[1]["phases"]
    bound = (max(sync["generate_s"], sync["train_s"]) + sync["sync_s"]) * BOUND_SLACK
    verdict = {
        "ratio": off["step_s"] / sync["step_s"],
        "bound_s": bound,
        "ratio_met": off["step_s"] <= OVERLAP_TARGET * sync["step_s"],
        "bound_met": off["step_s"] <= bound,
    }
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    print(f"\n{device} x {torch.cuda.device_count()}, {args.size}, separate placement, steady state (mean of steps 3..{args.steps})")
    print("measure".ljust(22) + "staleness 0".rjust(14) + "staleness 1".rjust(14))
    for key in sync:
        print(key.ljust(22) + f"{sync[key]:14.3f}{off[key]:14.3f}")
    print(f"staleness-1 / staleness-0 step: {verdict['ratio']:.3f} (target <= {OVERLAP_TARGET}: {'met' if verdict['ratio_met'] else 'missed'})")
    print(f"bound (max(generate, train) + sync) x {BOUND_SLACK}: {bound:.3f} s ({'met' if verdict['bound_met'] else 'missed'})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": device, "args": vars(args), "extra": extra, "verdict": verdict,
                                          "runs": {str(k): v for k, v in runs.items()}}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
