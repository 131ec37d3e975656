"""Overhead of the multi-turn loop per turn, with a scripted policy that forces tool calls.

    python -m benchmarks.agent_throughput [--engine hf|vllm] [--model tiny|0.5B] [--conversations 64]
        [--turns 4] [--tokens-per-turn 32] [--out results/agent_throughput.json]

Random weights never call tools, so every turn is generated for real by the engine (HF generate or an
in-process vLLM engine) and then replaced by a script: turns before the last call the calculator in the
Hermes format, the last one answers. The table compares the whole rollout with the engine's own time
in the same run (the baseline): what is left is the loop (parsing, tools, chat-template bridging,
tokenizing, scheduling) per turn.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.learning import report
from workers.config import actor_rollout_ref_config, fill_config, multi_turn_spec
from workers.rollout.agent.engines import HFTurns, VLLMTurns
from workers.rollout.agent.loop import TurnGenerator, TurnRequest
from workers.rollout.agent.rollout import AgentRollout
from workers.rollout.agent.scripted import ScriptedTurns
from workers.rollout.sampling import SamplingParams

CALCULATOR = str(Path(__file__).resolve().parents[1] / "examples" / "agents" / "calculator.py") + ":calculate"
CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "12 + 7 * 3"}}</tool_call>'


def build(model: str, work: Path) -> Path:
    if model == "tiny":
        from trainer.tiny_model import build_tiny_model

        return build_tiny_model(work / "model")
    from benchmarks.gpu_grpo_step import build_model

    build_model(work / "model")
    return work / "model"


def inner_generator(engine: str, path: Path, params: SamplingParams, device: torch.device, response_length: int) -> TurnGenerator:
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


def measure(agent: AgentRollout, generator: ScriptedTurns, prompts: dict[str, torch.Tensor], params: SamplingParams) -> dict[str, Any]:
    generator.engine_s, generator.rounds = 0.0, []
    start = time.perf_counter()
    with torch.no_grad():
        out = agent.run(prompts, [{}] * len(prompts["input_ids"]), generator, params, call_seed=1, rank=0)
    wall = time.perf_counter() - start
    turns = int(out["num_turns"].sum())
    return {
        "conversations": len(out["num_turns"]), "turns": turns, "tool_calls": int(out["num_tool_calls"].sum()),
        "tool_errors": int(out["num_tool_errors"].sum()), "rounds": len(generator.rounds), "wall_s": wall,
        "engine_s": generator.engine_s, "loop_s": wall - generator.engine_s,
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
    parser.add_argument("--out", default="results/agent_throughput.json")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    work = Path(tempfile.mkdtemp(prefix="agent_bench_"))
    path = build(args.model, work)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    eos = tokenizer.eos_token_id
    response_length = args.turns * (args.tokens_per_turn + 48)
    params = SamplingParams(True, 1.0, 1.0, 0, response_length, (eos,), tokenizer.pad_token_id)
    multi_turn = fill_config(multi_turn_spec(), {"enable": True, "tools": [CALCULATOR], "max_turns": args.turns,
                                                 "max_tokens_per_turn": args.tokens_per_turn})
    agent = AgentRollout(multi_turn, tokenizer, response_length, (eos,))
    call_tokens = len(tokenizer(CALL, add_special_tokens=False)["input_ids"]) + 1
    if call_tokens > args.tokens_per_turn:
        parser.error(f"--tokens-per-turn {args.tokens_per_turn} cannot hold the scripted call ({call_tokens} tokens with this tokenizer)")

    def script(request: TurnRequest) -> str:
        return CALL if request.turn < args.turns - 1 else "the answer is 33"

    generator = ScriptedTurns(tokenizer, eos, script, inner_generator(args.engine, path, params, device, response_length))
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"what is 12 + 7 * 3? ({i})"}], tokenize=False,
                                           add_generation_prompt=True) for i in range(args.conversations)]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    prompts = {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
               "position_ids": (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)}
    measure(agent, generator, prompts, params)  # warm-up (engine start-up, first compiles)
    result = measure(agent, generator, prompts, params)
    result.update(engine=args.engine, model=args.model, tokens_per_turn=args.tokens_per_turn, device=str(device),
                  gpu=torch.cuda.get_device_name(0) if device.type == "cuda" else None,
                  machine={"cpus": os.cpu_count(), "platform": platform.platform()})
    keys = ("conversations", "turns", "tool_calls", "tool_errors", "rounds", "wall_s", "engine_s", "loop_s", "loop_ms_per_turn",
            "model_tokens", "all_tokens")
    report(result, keys, args.out)


if __name__ == "__main__":
    main()
