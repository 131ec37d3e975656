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

from benchmarks.gpu_cases import cases
from benchmarks.suite_runner import Case, CaseResult, run_case


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
