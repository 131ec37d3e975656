"""Probe scripts that start a vLLM engine on the CPU run in a process of their own (vLLM in-process creates a
default torch.distributed group): `run_probe` runs one and returns the JSON its last line prints; `cpu_lora_llm`
is the LoRA-enabled engine the probes start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_probe(script: Path, model_path: Path, cwd: Path) -> Any:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    done = subprocess.run(
        [sys.executable, str(script), str(model_path)], env=env, capture_output=True, text=True, timeout=600, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_lora_llm(model_path: str) -> Any:
    """A vLLM engine in this process on the CPU, float32, adapters up to rank 8, one adapter at a time."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, where the probe reads it
    from vllm import LLM

    return LLM(model=model_path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20,
               distributed_executor_backend="uni", enable_lora=True, max_lora_rank=8, max_loras=1, max_model_len=128)
