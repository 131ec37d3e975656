"""The engine-trainer disagreement of a mixture of experts, with and without routing replay (R3).

    python -m benchmarks.routing_replay [--steps 10] [--workdir /tmp/routing_replay] [--out results/routing_replay.json]
        [overrides...]

Two runs of `python -m trainer.main` with the same seed and settings (default: the tiny mixture of experts with the
hybrid vLLM engine, a log-prob pass before every update; add overrides for another model or engine):

- `live`: the rollout records the experts it routed each token to (`rollout.enable_rollout_routing_replay=true`);
  the trainer routes with its own routers and only counts how often they chose otherwise (the baseline);
- `R3`: the trainer's log-prob pass and update replay the rollout's experts (`actor.router_replay.mode=R3`).

Per run: `router_replay/mismatch_log_prob` (the share of token-layer routings where the trainer's router chose
another expert set than the engine's), the engine-trainer log-prob gap of the sampled tokens (mean, max), the
update's mismatch and the reward, first and last steps. Prints a table; `--out` gets the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIDES = {
    "live": ("actor_rollout_ref.rollout.enable_rollout_routing_replay=true",),
    "R3": (
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
        "actor_rollout_ref.actor.router_replay.mode=R3",
    ),
}
DEFAULTS = (
    "actor_rollout_ref.model.path=outputs/tiny_moe",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.old_log_prob_pass=always",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.save_at_end=false",
    "trainer.logger=[console,jsonl]",
)
MEASURES = {
    "mismatch_log_prob": "router_replay/mismatch_log_prob",
    "mismatch_update": "router_replay/mismatch_update",
    "logprob_gap_mean": "rollout/logprob_gap_mean",
    "logprob_gap_max": "rollout/logprob_gap_max",
    "reward": "reward/mean",
    "step_s": "timing/step_s",
}


def side_command(side: str, folder: Path, steps: int, overrides: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "trainer.main", *DEFAULTS, f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={folder}", *SIDES[side], *overrides,
    ]


def summarize(rows: list[dict]) -> dict:
    """Each measure's mean over all steps, over the steps after the first (steady), and at the last step."""
    result: dict = {"steps": len(rows)}
    for name, key in MEASURES.items():
        values = [r[key] for r in rows if key in r]
        result[name] = {
            "mean": statistics.fmean(values) if values else None,
            "after_step_1": statistics.fmean(values[1:]) if len(values) > 1 else None,
            "last": values[-1] if values else None,
        }
    return result


def run_side(side: str, workdir: Path, steps: int, overrides: list[str]) -> dict:
    folder = workdir / side
    started = time.perf_counter()
    done = subprocess.run(side_command(side, folder, steps, overrides), check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        return {"error": f"exit code {done.returncode}", "wall_s": wall}
    rows = [json.loads(line) for line in (folder / "logs" / "metrics.jsonl").read_text().splitlines() if line]
    return {**summarize([r for r in rows if "reward/mean" in r]), "wall_s": wall}


def table(results: dict) -> str:
    lines = ["| side | " + " | ".join(MEASURES) + " | wall s |", "|---" * (len(MEASURES) + 2) + "|"]
    for side, result in results.items():
        if "error" in result:
            lines.append(f"| {side} | {result['error']} |")
            continue
        cells = [result[name]["after_step_1"] for name in MEASURES]
        shown = ["-" if v is None else f"{v:.4g}" for v in cells]
        lines.append(f"| {side} | " + " | ".join(shown) + f" | {result['wall_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/routing_replay"))
    parser.add_argument("--out", type=Path, default=Path("results/routing_replay.json"))
    args, overrides = parser.parse_known_args()
    results = {side: run_side(side, args.workdir, args.steps, overrides) for side in SIDES}
    print("means over the steps after the first:")
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"overrides": overrides, "steps": args.steps, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
