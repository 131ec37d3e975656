"""Running one case of the GPU suite (benchmarks/gpu_suite.py): its commands in a folder of its own, each as
a child process with a time limit, then the case's check on what the run left behind.

A case passes when every command exits 0 and its check holds. A failed case reports the first line of its
error: the `error:` line of an input mistake, else the last exception line the log shows (a worker's
exception reaches the driver's log inside Ray's wrapper, so the last one named is the innermost cause).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from benchmarks.steady_state import steady

METRICS_FILE = "metrics.jsonl"
REWARD = "reward/mean"
STEP_TIME = "timing/step_s"
SYNC_GAP = "rollout/sync_logprob_max_diff"  # logged by every verified weight sync (rollout.verify_sync=true)
ENGINE_GAP = "rollout/logprob_gap_mean"  # |engine - trainer| log-prob of the sampled tokens, per step
SCALED_SYNC_GAP = "rollout/sync_logprob_scaled_max_diff"  # the gap over each token's bound scale (verify.py)
# vLLM's checks of the whole GPU's free memory, which a neighbouring case upsets: at start-up (it grew while the
# engine measured its own use) and at sleep (the device's use after it is above the use before).
SHARED_GPU_RACES = ("Error in memory profiling", "Memory usage increased after sleeping")
_ERROR_LINE = re.compile(
    r"^(error: .*|[\w.]*(Error|Exception|Mismatch|Interrupt)(\(.*?\))?: .*|[\w.]*(Error|Exception))$"
)


def error_line(log: str) -> str:
    """The line that says what broke: the driver's `error: ...` line when there is one, else the last
    exception line (`SomeError: message`), else the last non-empty line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("error: "):
            return line[:300]
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line[:300]
    return lines[-1][:300] if lines else "(no output)"


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """The step records of the one run logged under `folder` (its `logs/metrics.jsonl`); [] before any."""
    files = sorted(folder.rglob(METRICS_FILE))
    if len(files) > 1:
        raise ValueError(f"{folder} holds {len(files)} {METRICS_FILE} files; a case runs one training folder: {files}")
    if not files:
        return []
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


def steady_step_s(rows: list[dict[str, Any]]) -> float | None:
    """The step time's steady state (benchmarks/steady_state.py), None without one."""
    seconds = steady(rows, STEP_TIME)
    return None if math.isnan(seconds) else round(seconds, 3)


@dataclass
class CommandRun:
    """What one command of a case did: exit code, wall time, and the step records it added."""

    argv: list[str]
    returncode: int
    wall_s: float
    rows: list[dict[str, Any]]
    log: Path
    timed_out: bool = False


def training_rows(run: CommandRun) -> list[dict[str, Any]]:
    """The step records of training steps (1, 2, ...): the validation before training logs step 0."""
    return [row for row in run.rows if isinstance(row.get("step"), int) and row["step"] >= 1]


def _synced_steps(run: CommandRun) -> list[dict[str, Any]]:
    """The steps that begin with a weight sync: all but a new run's first, which generates with the weights the
    engine loaded from the model folder (a resumed run's first step syncs the checkpoint's weights)."""
    rows = training_rows(run)
    return rows[1:] if rows and rows[0]["step"] == 1 else rows


class Check(Protocol):
    def describe(self) -> str:
        """What the check asserts, in words (the table's and the dry run's)."""
        ...

    def judge(self, folder: Path, runs: list[CommandRun]) -> list[str]:
        """What is wrong (empty: the check holds)."""
        ...

    def detail(self, runs: list[CommandRun]) -> str:
        """What was measured, for a passing case's row."""
        ...


@dataclass(frozen=True)
class RunCheck:
    """A training run's metrics: the steps it should reach, values that must be finite, learning, syncs,
    offload traffic, and where a resumed run starts."""

    steps: int
    finite: tuple[str, ...] = ("actor/pg_loss",)
    reward_rises_by: float | None = None  # mean of the last 3 steps minus the first 3
    last_reward_at_least: float | None = None
    synced: bool = False  # every step's weight sync was verified (SYNC_GAP logged; the run stops on a mismatch)
    offloaded: bool = False  # some phase moved bytes to the host
    resumed_after: int | None = None  # the last command resumes from this step's checkpoint
    first_step: tuple[tuple[str, float], ...] = ()  # metrics the first logged step must hold, with these values
    at_most: tuple[tuple[str, float], ...] = ()  # metrics that must stay at or below these bounds at every step

    def describe(self) -> str:
        parts = [f"reaches step {self.steps}", " and ".join(self.finite) + " finite"]
        if self.reward_rises_by is not None:
            parts.append(f"reward rises by >= {self.reward_rises_by}")
        if self.last_reward_at_least is not None:
            parts.append(f"last reward >= {self.last_reward_at_least}")
        if self.synced:
            parts.append("every sync verified")
        if self.offloaded:
            parts.append("offload moved bytes")
        if self.resumed_after is not None:
            parts.append(f"resumed at step {self.resumed_after + 1}")
        parts.extend(f"step 1 logs {key}={value}" for key, value in self.first_step)
        parts.extend(f"{key} <= {bound} at every step" for key, bound in self.at_most)
        return "; ".join(parts)

    def judge(self, folder: Path, runs: list[CommandRun]) -> list[str]:
        rows = [row for run in runs for row in training_rows(run)]
        if not rows:
            return ["no step was logged"]
        problems = []
        if rows[-1].get("step") != self.steps:
            problems.append(f"last step {rows[-1].get('step')}, expected {self.steps}")
        for key in self.finite:
            bad = [r["step"] for r in rows if not isinstance(r.get(key), (int, float)) or not math.isfinite(r[key])]
            if bad:
                problems.append(f"{key} missing or not finite at steps {bad[:5]}")
        rewards = [r[REWARD] for r in rows if REWARD in r]
        if self.reward_rises_by is not None:
            rise = statistics.mean(rewards[-3:]) - statistics.mean(rewards[:3]) if len(rewards) >= 6 else float("nan")
            if not rise >= self.reward_rises_by:
                problems.append(
                    f"reward rose by {rise:.3f} ({rewards[0]:.3f} -> {rewards[-1]:.3f}), wanted {self.reward_rises_by}"
                )
        if self.last_reward_at_least is not None and not (rewards and rewards[-1] >= self.last_reward_at_least):
            problems.append(f"last reward {rewards[-1] if rewards else None}, wanted >= {self.last_reward_at_least}")
        if self.synced:
            unverified = [r["step"] for run in runs for r in _synced_steps(run) if SYNC_GAP not in r]
            if unverified:
                problems.append(f"no verified sync at steps {unverified[:5]}")
        if self.offloaded and not any(
            k.startswith("offload/") and k.endswith("d2h_gib") and v > 0 for r in rows for k, v in r.items()
        ):
            problems.append("no offload/*/d2h_gib above 0: nothing left the GPU")
        for key, bound in self.at_most:
            over = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not r[key] <= bound]
            if over:
                problems.append(f"{key} above {bound} at (step, value) {over[:5]}")
        for key, value in self.first_step:
            if rows[0].get(key) != value:
                problems.append(f"step {rows[0].get('step')} logged {key}={rows[0].get(key)}, expected {value}")
        if self.resumed_after is not None:
            resumed = [r["step"] for r in training_rows(runs[-1])]
            if resumed[:1] != [self.resumed_after + 1]:
                problems.append(
                    f"the resumed run logged steps {resumed[:3]}..., expected to start at {self.resumed_after + 1}"
                )
        return problems

    def detail(self, runs: list[CommandRun]) -> str:
        rows = [row for run in runs for row in training_rows(run)]
        rewards = [r[REWARD] for r in rows if REWARD in r]
        text = f"reward {rewards[0]:.2f}->{rewards[-1]:.2f}" if rewards else "no reward"
        gaps = [r[SYNC_GAP] for r in rows if SYNC_GAP in r]
        if gaps:
            scaled = [r[SCALED_SYNC_GAP] for r in rows if SCALED_SYNC_GAP in r]
            text += f"; sync gap max {max(gaps):.3f}" + (f", scaled {max(scaled):.3f}" if scaled else "")
            text += f" ({len(gaps)} syncs)"
        engine_gaps = [r[ENGINE_GAP] for r in rows if ENGINE_GAP in r]
        if engine_gaps:  # the rollout's own log-probs against the trainer's of the same tokens, averaged over steps
            text += f"; engine-trainer log-prob gap mean {sum(engine_gaps) / len(engine_gaps):.4f}"
        for key, bound in self.at_most:
            values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
            if values:
                text += f"; {key} mean {statistics.mean(values):.4f}, max {max(values):.4f}"
        return text


@dataclass(frozen=True)
class ExampleCheck:
    """benchmarks/engine_examples.py's JSON: every expected example ran and passed its verified sync."""

    examples: tuple[str, ...]
    result_file: str = "examples.json"

    def describe(self) -> str:
        return f"examples {', '.join(self.examples)} pass (sync verified)"

    def judge(self, folder: Path, runs: list[CommandRun]) -> list[str]:
        path = folder / self.result_file
        if not path.is_file():
            return [f"no {self.result_file} written"]
        rows = json.loads(path.read_text())["rows"]
        ran = {row["example"]: row for row in rows}
        problems = [f"{name} did not run" for name in self.examples if name not in ran]
        problems += [f"{row['example']}: {row.get('error', 'failed')}" for row in rows if not row["passed"]]
        return problems

    def detail(self, runs: list[CommandRun]) -> str:
        """Each example's wall time (the case's own grew from 177 to 266 s between two GPU runs: which example?)."""
        if not runs:
            return ""
        path = runs[-1].log.parent / self.result_file  # the case's folder holds its logs and the examples' JSON
        if not path.is_file():
            return ""
        rows = json.loads(path.read_text())["rows"]
        return ", ".join(f"{row['example']} {row['wall_s']:.0f} s" for row in rows if "wall_s" in row)


@dataclass(frozen=True)
class HistoryCheck:
    """examples/strategy_ppo.py's history JSON (a list of steps from 0): the steps it ran, its loss finite at each,
    the reward rising (mean of the last 3 steps minus the first 3), every step's engine update verified."""

    steps: int
    reward_rises_by: float
    finite: tuple[str, ...] = ("actor/loss",)
    result_file: str = "history.json"

    def describe(self) -> str:
        rise = self.reward_rises_by
        finite = " and ".join(self.finite)
        return f"runs {self.steps} steps; {finite} finite; reward rises by >= {rise}; every update verified"

    def _rows(self, folder: Path) -> list[dict[str, Any]]:
        path = folder / self.result_file
        return json.loads(path.read_text()) if path.is_file() else []

    def judge(self, folder: Path, runs: list[CommandRun]) -> list[str]:
        rows = self._rows(folder)
        if not rows:
            return [f"no {self.result_file} written"]
        problems = [] if len(rows) == self.steps else [f"ran {len(rows)} steps, expected {self.steps}"]
        for key in self.finite:
            bad = [r["step"] for r in rows if not math.isfinite(r.get(key, math.nan))]
            if bad:
                problems.append(f"{key} missing or not finite at steps {bad[:5]}")
        rewards = [r["reward"] for r in rows]
        rise = statistics.mean(rewards[-3:]) - statistics.mean(rewards[:3])
        if not rise >= self.reward_rises_by:
            problems.append(
                f"reward rose by {rise:.3f} ({rewards[0]:.3f} -> {rewards[-1]:.3f}), wanted {self.reward_rises_by}"
            )
        unverified = [r["step"] for r in rows if SYNC_GAP not in r]
        if unverified:
            problems.append(f"no verified engine update at steps {unverified[:5]}")
        return problems

    def detail(self, runs: list[CommandRun]) -> str:
        rows = self._rows(runs[-1].log.parent) if runs else []
        if not rows:
            return ""
        gaps = [r[SYNC_GAP] for r in rows if SYNC_GAP in r]
        gap = max(gaps, default=math.nan)
        return f"reward {rows[0]['reward']:.2f}->{rows[-1]['reward']:.2f}; sync gap max {gap:.3f} ({len(gaps)} syncs)"


@dataclass(frozen=True)
class Case:
    """One GPU path: the commands that run it (the arguments of `python`), the check, a time limit."""

    name: str
    part: str  # "one" (one GPU) or "two" (two GPUs)
    path: str  # what it exercises, in words
    commands: tuple[tuple[str, ...], ...]
    check: Check
    timeout_s: int = 300
    alone: bool = False  # runs with no other case beside it (its engines' start-up measures the GPU's free memory)

    def command_lines(self) -> list[str]:
        return ["python " + " ".join(command) for command in self.commands]


@dataclass
class CaseResult:
    name: str
    part: str
    path: str
    commands: list[str]
    check: str
    passed: bool = False
    error: str | None = None
    wall_s: float = 0.0
    steady_step_s: float | None = None
    detail: str = ""
    retried: str | None = None  # the first attempt's error, when the case ran twice
    runs: list[dict[str, Any]] = field(default_factory=list)


def _run_command(argv: list[str], folder: Path, log: Path, timeout_s: float, env: dict[str, str]) -> tuple[int, bool]:
    """Run in its own process group, so a timeout also stops what the command started (its Ray cluster)."""
    with open(log, "w") as out:
        process = subprocess.Popen(
            argv,
            cwd=folder,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            return process.wait(timeout=max(timeout_s, 1)), False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return -signal.SIGKILL, True


def run_case(case: Case, root: Path, env: dict[str, str] | None = None) -> CaseResult:
    """Run `case` in `root/<name>` (made empty first): its commands in order while they succeed, then its check.
    A case stopped by one of vLLM's checks of the whole GPU's memory that a neighbouring case upset runs once more
    (`retried` says why): two cases share a GPU, and vLLM refuses to start when the GPU's free memory grows while
    it measures its own use, and stops when the device's use grew while its engine went to sleep."""
    result = _attempt(case, root, env)
    if result.error is not None and any(race in result.error for race in SHARED_GPU_RACES):
        first_error = result.error
        result = _attempt(case, root, env)
        result.retried = first_error
    return result


def _attempt(case: Case, root: Path, env: dict[str, str] | None) -> CaseResult:
    folder = root / case.name
    if folder.exists():
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    folder.mkdir(parents=True)
    result = CaseResult(case.name, case.part, case.path, case.command_lines(), case.check.describe())
    started = time.perf_counter()
    runs: list[CommandRun] = []
    for index, command in enumerate(case.commands):
        argv = [sys.executable, *command]
        log = folder / f"command_{index}.log"
        before = len(read_metrics(folder))
        remaining = case.timeout_s - (time.perf_counter() - started)
        begin = time.perf_counter()
        code, timed_out = _run_command(argv, folder, log, remaining, {**os.environ, **(env or {})})
        rows = read_metrics(folder)[before:]
        runs.append(CommandRun(argv, code, round(time.perf_counter() - begin, 2), rows, log, timed_out))
        if code != 0:
            result.error = (
                f"timed out after {case.timeout_s} s" if timed_out else error_line(log.read_text(errors="replace"))
            )
            break
    result.wall_s = round(time.perf_counter() - started, 2)
    result.runs = [
        {
            "command": " ".join(r.argv[1:]),
            "returncode": r.returncode,
            "wall_s": r.wall_s,
            "steps": len(r.rows),
            "log": str(r.log),
        }
        for r in runs
    ]
    result.steady_step_s = steady_step_s(training_rows(runs[-1])) if runs else None
    if result.error is None:
        problems = case.check.judge(folder, runs)
        result.passed = not problems
        result.error = "; ".join(problems) or None
    result.detail = case.check.detail(runs)
    return result
