"""Overhead of the multi-turn loop per turn, with a scripted policy that forces tool calls.

    python -m benchmarks.agent_throughput [--engine hf|vllm] [--model tiny|0.5B] [--conversations 64]
        [--turns 4] [--tokens-per-turn 96] [--tool-delay-ms 0] [--schedule stream[,rounds]] [--repeats 1]
        [--out results/agent_throughput.json]

Random weights never call tools, so every turn is generated for real by the engine (HF generate in rounds,
or an in-process vLLM engine batching continuously) and then replaced by a script: turns before the last
call the calculator in the Hermes format, the last one answers. The table compares the whole rollout with
the engine's own time in the same run (the baseline): what is left is the loop (parsing, tools,
chat-template bridging, tokenizing, scheduling) per turn. On vLLM, `joined_running_batch` counts turns
that entered the engine while other conversations' turns were generating.

With `--tool-delay-ms D` every tool call waits a seeded random time (exponential, mean D ms) before it
answers. `--schedule rounds` drives the same vLLM engine in rounds (a round's turns go in together and the
round ends when its last turn does: the baseline schedule) instead of continuously. `--schedule
stream,rounds --repeats N` measures both on one engine, alternating, N times each after one warm-up, and
reports each schedule's median run (same engine, same delays, same machine state).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.learning import report
from workers.config import actor_rollout_ref_config, multi_turn_config
from workers.rollout.agent.engines import HFTurns, VLLMTurns
from workers.rollout.agent.loop import StreamingTurnGenerator, TurnGenerator, TurnOutput, TurnRequest
from workers.rollout.agent.rollout import AgentRollout
from workers.rollout.agent.scripted import Script, ScriptedStream, ScriptedTurns
from workers.rollout.sampling import SamplingParams

CALCULATOR = str(Path(__file__).resolve().parents[1] / "examples" / "agents" / "calculator.py") + ":calculate"
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "12 + 7 * 3"}}</tool_call>'
SLOW_TOOL = str(Path(__file__).with_name("agent_tools.py")) + ":calculate_slowly"


def delayed_call(delay_s: float) -> str:
    return f'<tool_call>{{"name": "calculate_slowly", "arguments": {{"expression": "12 + 7 * 3", "delay_s": {delay_s:.3f}}}}}</tool_call>'


def tool_delay_s(mean_ms: float, row: int, turn: int) -> float:
    """The same delays in every run and schedule: seeded by (row, turn)."""
    return random.Random(row * 1009 + turn).expovariate(1000 / mean_ms) if mean_ms > 0 else 0.0


class RoundsOver:
    """A continuously batching engine driven in rounds (the baseline schedule): a round's turns are
    submitted together and the round returns when its last turn finishes."""

    lockstep = False

    def __init__(self, stream: StreamingTurnGenerator) -> None:
        self.stream = stream

    def any_work(self, local: bool) -> bool:
        return local

    def generate(self, requests: list[TurnRequest]) -> list[TurnOutput]:
        for request in requests:
            self.stream.submit(request)
        finished: dict[tuple[int, int], TurnOutput] = {}
        while self.stream.in_flight():
            finished.update({(r.row, r.turn): output for r, output in self.stream.step()})
        return [finished[(r.row, r.turn)] for r in requests]


def build(model: str, work: Path) -> Path:
    if model == "tiny":
        from trainer.tiny_model import build_tiny_model

        return build_tiny_model(work / "model")
    from benchmarks.gpu_grpo_step import build_model

    build_model(work / "model")
    return work / "model"


def inner_generator(
    engine: str, path: Path, params: SamplingParams, device: torch.device, response_length: int
) -> TurnGenerator | StreamingTurnGenerator:
    if engine == "hf":
        from transformers import AutoModelForCausalLM

        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        return HFTurns(model, params, device, synced=False)
    from workers.rollout.vllm_engine import VLLMEngine

    rollout = actor_rollout_ref_config({"model": {"path": str(path)}, "rollout": {
        "max_model_len": response_length + 64, "gpu_memory_utilization": 0.5, "enable_sleep": False}})["rollout"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return VLLMTurns(VLLMEngine(str(path), rollout, dtype, device, seed=0).llm, params, call_seed=0, rank=0)


def scripted(tokenizer: Any, eos: int, script: Script, inner: TurnGenerator | StreamingTurnGenerator) -> ScriptedTurns | ScriptedStream:
    if isinstance(inner, StreamingTurnGenerator):
        return ScriptedStream(tokenizer, eos, script, inner)
    return ScriptedTurns(tokenizer, eos, script, inner)


def scheduling(generator: ScriptedTurns | ScriptedStream) -> dict[str, Any]:
    if isinstance(generator, ScriptedStream):
        joined = sum(1 for _, request, in_flight in generator.submissions if request.turn > 0 and in_flight > 0)
        return {"engine_calls": generator.steps, "joined_running_batch": joined}
    return {"engine_calls": len(generator.rounds), "joined_running_batch": None}


def measure(
    agent: AgentRollout, make_generator: Callable[[], ScriptedTurns | ScriptedStream], prompts: dict[str, torch.Tensor], params: SamplingParams
) -> dict[str, Any]:
    generator = make_generator()
    start = time.perf_counter()
    with torch.no_grad():
        out = agent.run(prompts, [{}] * len(prompts["input_ids"]), generator, params, call_seed=1, rank=0)
    wall = time.perf_counter() - start
    turns = int(out["num_turns"].sum())
    schedule = scheduling(generator)
    return {
        "conversations": len(out["num_turns"]), "turns": turns, "tool_calls": int(out["num_tool_calls"].sum()),
        "tool_errors": int(out["num_tool_errors"].sum()), **schedule, "wall_s": wall,
        "engine_s": generator.engine_s, "engine_ms_per_call": 1000 * generator.engine_s / max(1, schedule["engine_calls"]),
        "loop_s": wall - generator.engine_s,
        "loop_ms_per_turn": 1000 * (wall - generator.engine_s) / turns,
        "model_tokens": int(out["response_mask"].sum()), "all_tokens": int(out["attention_mask"][:, -agent.settings.response_length :].sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--model", choices=("tiny", "0.5B"), default="tiny")
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens-per-turn", type=int, default=96, help="must fit the scripted call (80 characters)")
    parser.add_argument("--tool-delay-ms", type=float, default=0.0, help="mean tool latency (exponential); 0 = the calculator")
    parser.add_argument("--schedule", default=None, help="vLLM: stream (continuous, the default), rounds, or both: stream,rounds; HF: rounds")
    parser.add_argument("--repeats", type=int, default=1, help="measured runs per schedule after one warm-up; the median is reported")
    parser.add_argument("--out", default="results/agent_throughput.json")
    args = parser.parse_args()
    schedules = (args.schedule or ("stream" if args.engine == "vllm" else "rounds")).split(",")
    if not set(schedules) <= {"stream", "rounds"} or len(set(schedules)) != len(schedules):
        parser.error(f"--schedule {args.schedule!r}: give stream, rounds or stream,rounds")
    if "stream" in schedules and args.engine != "vllm":
        parser.error("--schedule stream needs --engine vllm (HF generate works in rounds only)")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = Path(tempfile.mkdtemp(prefix="agent_bench_"))
    path = build(args.model, work)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    eos = tokenizer.eos_token_id
    response_length = args.turns * (args.tokens_per_turn + 48)
    params = SamplingParams(True, 1.0, 1.0, 0, response_length, (eos,), tokenizer.pad_token_id)
    tool = SLOW_TOOL if args.tool_delay_ms > 0 else CALCULATOR
    multi_turn = multi_turn_config({"enable": True, "tools": [tool], "max_turns": args.turns,
                                                 "max_tokens_per_turn": args.tokens_per_turn})
    agent = AgentRollout(multi_turn, tokenizer, response_length, (eos,))
    longest_call = delayed_call(99.999) if args.tool_delay_ms > 0 else CALL
    call_tokens = len(tokenizer(longest_call, add_special_tokens=False)["input_ids"]) + 1
    if call_tokens > args.tokens_per_turn:
        parser.error(f"--tokens-per-turn {args.tokens_per_turn} cannot hold the scripted call ({call_tokens} tokens with this tokenizer)")

    def script(request: TurnRequest) -> str:
        if request.turn == args.turns - 1:
            return "the answer is 33"
        return delayed_call(tool_delay_s(args.tool_delay_ms, request.row, request.turn)) if args.tool_delay_ms > 0 else CALL

    inner = inner_generator(args.engine, path, params, device, response_length)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"what is 12 + 7 * 3? ({i})"}], tokenize=False,
                                           add_generation_prompt=True) for i in range(args.conversations)]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    prompts = {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
               "position_ids": (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)}

    def make_generator(schedule: str) -> Callable[[], ScriptedTurns | ScriptedStream]:
        engine = RoundsOver(inner) if schedule == "rounds" and isinstance(inner, StreamingTurnGenerator) else inner
        return lambda: scripted(tokenizer, eos, script, engine)

    measure(agent, make_generator(schedules[0]), prompts, params)  # warm-up (engine start-up, first compiles)
    runs: dict[str, list[dict[str, Any]]] = {schedule: [] for schedule in schedules}
    for _ in range(args.repeats):
        for schedule in schedules:  # alternating, so a drift of the machine touches every schedule alike
            runs[schedule].append(measure(agent, make_generator(schedule), prompts, params))
    setting = dict(engine=args.engine, model=args.model, tokens_per_turn=args.tokens_per_turn, tool_delay_ms=args.tool_delay_ms,
                   repeats=args.repeats, device=str(device), gpu=torch.cuda.get_device_name(0) if device.type == "cuda" else None,
                   machine={"cpus": os.cpu_count(), "platform": platform.platform()})
    keys = ("conversations", "turns", "tool_calls", "tool_errors", "engine_calls", "joined_running_batch", "wall_s", "engine_s",
            "engine_ms_per_call", "loop_s", "loop_ms_per_turn", "model_tokens", "all_tokens")
    for schedule, results in runs.items():
        result = {**median_run(results), "schedule": schedule, "wall_s_all_runs": [r["wall_s"] for r in results], **setting}
        out = args.out if len(schedules) == 1 else str(Path(args.out).with_suffix(f".{schedule}.json"))
        report(result, keys, out, header=f"{schedule} (median of {args.repeats})")


def median_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median whole-rollout time (a real run, so its columns belong together)."""
    return sorted(results, key=lambda r: r["wall_s"])[(len(results) - 1) // 2]


if __name__ == "__main__":
    main()
