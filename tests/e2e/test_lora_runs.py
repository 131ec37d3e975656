"""LoRA GRPO through `trainer.main` (HF rollout): it learns the default task, its export loads in
transformers and peft alike, and a resumed run reproduces a straight one exactly (the learning run's first steps)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.e2e.conftest import ONE_RANK, comparable_metrics, run_overrides
from tests.e2e.test_training_runs import _train_rewards
from trainer.config_loader import load_config
from trainer.main import run

pytestmark = pytest.mark.slow

# The random tiny model's embeddings are so small that its linear layers alone cannot sharpen the output
# distribution (the final norm bounds the logits); an adapter on the LM head as well lets it learn.
LEARNING_LORA = (
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]",
    "actor_rollout_ref.actor.optim.lr=5e-3",
    ONE_RANK,
)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def learning_run(ray_cluster, tiny_assets, tmp_path_factory):
    """One 14-step LoRA run, shared: the learning test checks its rewards and export; its first 4 steps are the
    straight run the resume test compares with (a constant learning rate: the step count changes no step before it)."""
    out = tmp_path_factory.mktemp("lora_learning")
    cfg = load_config(run_overrides(
        tiny_assets, out, *LEARNING_LORA, "trainer.total_training_steps=14", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.save_at_end=false", "trainer.export_hf_at_end=true",
    ))
    return run(cfg), out


def test_lora_grpo_learns_and_exports_merged_and_adapter(learning_run, tiny_assets):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    history, out = learning_run
    rewards = _train_rewards(history)
    assert len(rewards) == 14
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.3, rewards

    export = out / "hf_export"
    merged = AutoModelForCausalLM.from_pretrained(str(export), dtype=torch.float32).eval()
    assert merged.config.tie_word_embeddings is False  # the adapted head differs from the input embedding now
    base = AutoModelForCausalLM.from_pretrained(tiny_assets["model"], dtype=torch.float32).eval()
    ids = torch.randint(3, 90, (3, 20), generator=torch.Generator().manual_seed(0))
    base_logits = _logits(base, ids)
    adapted = PeftModel.from_pretrained(base, str(export / "lora_adapter")).eval()
    torch.testing.assert_close(_logits(merged, ids), _logits(adapted, ids), atol=1e-4, rtol=0)
    assert float((_logits(merged, ids) - base_logits).abs().max()) > 0.1


def test_lora_resume_reproduces_a_straight_run(learning_run, tiny_assets, tmp_path):
    common = ("trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=2", *LEARNING_LORA)
    straight = learning_run[0][:3]  # the same settings run straight through (no saves, 14 steps)
    first = run(load_config(run_overrides(tiny_assets, tmp_path / "resumed", "trainer.total_training_steps=2", *common)))
    second = run(load_config(run_overrides(tiny_assets, tmp_path / "resumed", "trainer.total_training_steps=3", *common)))
    assert [r["step"] for r in second] == [3]
    assert comparable_metrics(first + second) == comparable_metrics(straight)
    manifest = json.loads(Path(tmp_path / "resumed" / "global_step_2" / "MANIFEST.json").read_text())
    model_bytes = (Path(tiny_assets["model"]) / "model.safetensors").stat().st_size
    actor_bytes = sum(size for name, size in manifest["files"].items() if name.startswith("actor/model_optim/"))
    assert actor_bytes < model_bytes  # adapter + its Adam state, not the base weights
