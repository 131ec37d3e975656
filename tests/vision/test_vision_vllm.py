"""vLLM with pictures, through benchmarks/vlm_vllm_check.py at the tiny size: GRPO steps on the image task
with every weight sync verified, and the engine's log-probs of its samples against the trainer's with the
same pictures before and after a sync that changed only the vision tower (the engine must forget the
pictures' cached embeddings); and GRPO with separate engines (broadcast sync, verified). vLLM's Qwen2-VL imports transformers' torchvision image processor, which the
CPU test install removes, so this runs only where that import works (a GPU install, or a CPU one with a
torchvision that imports)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def vllm_serves_qwen2_vl() -> bool:
    try:
        importlib.import_module("vllm")
        # What vLLM's Qwen2-VL imports (transformers' lazy `from ... import` would not load it).
        importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl")
    except Exception:  # no vLLM, or a torchvision that is missing or does not load (not only ImportError)
        return False
    return True


@pytest.mark.skipif(not vllm_serves_qwen2_vl(), reason="vLLM cannot load Qwen2-VL here (torchvision does not import)")
def test_vllm_with_pictures_verified_syncs_and_vision_tower(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "benchmarks.vlm_vllm_check", "--out", str(out), "--workdir", str(tmp_path / "work"),
               "--steps", "3"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=900)
    result = json.loads((out / "vlm_vllm_check.json").read_text())
    assert finished.returncode == 0 and result["ok"], finished.stdout[-3000:]
    grpo, images = result["grpo"], result["images"]
    assert len(grpo["steps"]) == 3 and grpo["syncs_verified"] >= 2
    assert grpo["worst_sync_logprob_max_diff"] <= 1e-3  # fp32 on CPU
    assert images["after_sync_max_diff"] <= 1e-3 < images["vision_changed_before_sync_max_diff"]


@pytest.mark.skipif(not vllm_serves_qwen2_vl(), reason="vLLM cannot load Qwen2-VL here (torchvision does not import)")
def test_separate_vllm_engines_with_pictures_verified_syncs(ray_cluster, tiny_vlm_dir, visual_data, tmp_path):
    """The engines in processes of their own: the trainer broadcasts every weight, the vision tower's included,
    and checks each engine's probe log-probs against its own (`probe_log_probs` of a vision-language model)."""
    from tests.vision.test_visual_task import visual_run
    from trainer.config_loader import load_config
    from trainer.main import run

    history = run(load_config(visual_run(
        tiny_vlm_dir, visual_data, tmp_path, "trainer.total_training_steps=3", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.verify_sync=true",
    )))
    assert len(history) == 3
    synced = [r for r in history if "rollout/sync_logprob_max_diff" in r]
    assert len(synced) >= 2 and max(r["rollout/sync_logprob_max_diff"] for r in synced) <= 1e-3, history
