"""Does vLLM's in-place reload write a mixture of experts' experts? The check behind the engine's weight sync.

    python -m benchmarks.vllm_moe_reload [--folder /tmp/vllm_moe_reload]

Builds the tiny Qwen3-MoE (trainer/tiny_moe.py), starts a vLLM engine on it in this process, then reloads every
expert tensor and layer 0's `q_proj` as zeros under the checkpoint's per-expert names through
`model_runner.reload_weights` (the call the engine's sync makes) and reads layer 0's parameters back: the experts'
|sum| must drop to 0 (on a GPU the fused `qkv_proj` also loses its query third), and greedy generation changes.
vLLM 0.26 on CUDA logs "Following weights were not loaded from checkpoint" for the experts after such a reload;
this says whether they were. Runs on a GPU, or on vLLM's CPU build.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file


def layer0_sums(worker: Any) -> dict[str, float]:
    """|sum| of layer 0's attention, router and expert parameters, inside vLLM's worker."""
    model = worker.model_runner.get_model()
    return {name: round(float(p.float().abs().sum()), 3) for name, p in model.named_parameters()
            if "layers.0." in name and ("experts" in name or "qkv" in name or "gate" in name)}


def zeroed_experts(folder: Path) -> list[tuple[str, torch.Tensor]]:
    state: dict[str, torch.Tensor] = {}
    for file in folder.glob("*.safetensors"):
        state.update(load_file(file))
    return [(name, torch.zeros_like(t) if ".experts." in name or "layers.0.self_attn.q_proj" in name else t)
            for name, t in state.items()]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", default="/tmp/vllm_moe_reload")
    args = parser.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: the checks pass callables
    folder = Path(args.folder)
    subprocess.run([sys.executable, "-m", "trainer.tiny_moe", str(folder)], check=True)
    from vllm import LLM, SamplingParams

    llm = LLM(str(folder), enforce_eager=True, gpu_memory_utilization=0.2, dtype="bfloat16")
    pairs = zeroed_experts(folder)
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9, 10]}
    greedy = SamplingParams(max_tokens=4, temperature=0, logprobs=1)

    def reload(worker: Any) -> None:
        worker.model_runner.reload_weights(weights_iterator=iter([(n, t.to(worker.device)) for n, t in pairs]))

    result = {"before": llm.collective_rpc(layer0_sums)[0],
              "generation_before": llm.generate([prompt], greedy)[0].outputs[0].cumulative_logprob}
    llm.collective_rpc(reload)
    result |= {"after": llm.collective_rpc(layer0_sums)[0],
               "generation_after": llm.generate([prompt], greedy)[0].outputs[0].cumulative_logprob}
    experts = [name for name in result["after"] if "experts" in name]
    result["experts_written"] = all(result["after"][name] == 0 for name in experts) and bool(experts)
    for key, value in result.items():
        print(f"{key}: {value}")
    return result


if __name__ == "__main__":
    raise SystemExit(0 if main()["experts_written"] else 1)
