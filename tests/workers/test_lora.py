"""LoRA on the FSDP actor (2 Ray workers): only adapters train, the reference is the base model with the
adapters disabled, checkpoints hold the adapter and resume exactly, the export merges and also writes the
adapter in PEFT's format; gradient checkpointing and packed forwards give the same step."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from tests.workers.helpers import (
    actor_config,
    assert_resume_round_trip,
    hf_response_log_probs,
    make_group,
    random_prompts,
)
from workers.fsdp import ActorRolloutRefWorker

LORA = {"lora_rank": 8, "lora_alpha": 16}
LR = 5e-2  # large enough that one step moves the adapter visibly


def lora_config(model_dir: str, eps: float = 1e-8, **model):
    optim = {"lr": LR, "lr_warmup_steps": 2, "eps": eps}
    return actor_config(model_dir, model={**LORA, **model}, actor={"optim": optim, "use_kl_loss": True})


@pytest.fixture(scope="module")
def lora_group(pool_2, tiny_model_dir):
    group = make_group(pool_2, ActorRolloutRefWorker, lora_config(tiny_model_dir), "actor_rollout_ref")
    yield group
    group.kill()


def _training_batch(group, seed=7):
    data = group.generate_sequences(random_prompts(8, [3, 6], seed=seed))
    data = data.union(group.compute_log_prob(data)).union(group.compute_ref_log_prob(data))
    data.batch["advantages"] = torch.randn(data.batch["responses"].shape, generator=torch.Generator().manual_seed(seed))
    return data


def _base_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_ref_is_the_base_model_and_only_adapters_move(lora_group, tiny_model_dir, tmp_path):
    data = _training_batch(lora_group)
    real = data.batch["response_mask"].bool()  # packed forwards score real response tokens only
    base = hf_response_log_probs(_base_model(tiny_model_dir), data)
    # A fresh adapter (B = 0) changes nothing; the reference is exactly the base model.
    torch.testing.assert_close(data.batch["old_log_probs"][real], base[real], atol=1e-5, rtol=0)
    for _ in range(2):
        lora_group.update_actor(data)
    trained = lora_group.compute_log_prob(data).batch["old_log_probs"]
    ref = lora_group.compute_ref_log_prob(data).batch["ref_log_prob"]
    torch.testing.assert_close(ref[real], base[real], atol=1e-5, rtol=0)
    assert float((trained - ref)[real].abs().max()) > 1e-2  # the adapter did change the policy

    lora_group.export_hf(str(tmp_path / "hf"))
    merged, initial = load_file(tmp_path / "hf" / "model.safetensors"), load_file(f"{tiny_model_dir}/model.safetensors")
    assert set(initial) <= set(merged)  # (the export also writes the tied LM head under its own name)
    moved = {k for k in initial if not torch.equal(merged[k], initial[k])}
    # Linear layers of the decoder moved (merged adapters); embeddings and norms (no adapter) did not.
    assert moved and all(k.startswith("model.layers.") and k.endswith("proj.weight") for k in moved), moved


def test_export_merged_and_adapter_load_with_the_trained_log_probs(lora_group, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = _training_batch(lora_group, seed=8)
    lora_group.update_actor(data)
    expected = lora_group.compute_log_prob(data).batch["old_log_probs"]
    real = data.batch["response_mask"].bool()
    lora_group.export_hf(str(tmp_path / "hf"))
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "lora_adapter"} <= set(os.listdir(tmp_path / "hf"))
    assert set(os.listdir(tmp_path / "hf" / "lora_adapter")) == {"adapter_config.json", "adapter_model.safetensors"}
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    torch.testing.assert_close(hf_response_log_probs(merged, data)[real], expected[real], atol=1e-5, rtol=0)
    adapted = PeftModel.from_pretrained(_base_model(tiny_model_dir), str(tmp_path / "hf" / "lora_adapter")).eval()
    torch.testing.assert_close(hf_response_log_probs(adapted, data)[real], expected[real], atol=1e-5, rtol=0)
    config = json.loads((tmp_path / "hf" / "lora_adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (8, 16, "all-linear")
    assert config["base_model_name_or_path"] == os.path.abspath(tiny_model_dir)


def test_checkpoint_holds_the_adapter_and_resumes_exactly(lora_group, pool_1, tiny_model_dir, tmp_path):
    assert_resume_round_trip(lora_group, _training_batch(lora_group, seed=9), str(tmp_path / "ckpt"))

    keys = FileSystemReader(str(tmp_path / "ckpt" / "model_optim")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    optimizer_keys = [k for k in keys if k.startswith("optimizer.state.")]
    # Only the adapter factors and their Adam state (2 layers x 7 linears x A, B); no frozen base weight.
    assert len(model_keys) == 28 and all(".lora_A." in k or ".lora_B." in k for k in model_keys), model_keys
    assert optimizer_keys and all(".lora_A." in k or ".lora_B." in k for k in optimizer_keys)

    full = make_group(pool_1, ActorRolloutRefWorker, actor_config(tiny_model_dir), "actor_rollout")
    try:
        with pytest.raises(Exception, match="saved with lora=.*this run has lora=None"):
            full.load_checkpoint(str(tmp_path / "ckpt"))
    finally:
        full.kill()


def test_gradient_checkpointing_and_packing_give_the_same_lora_step(pool_1, tiny_model_dir, tmp_path):
    """One rank, one step on the same batch: padded without checkpointing == packed with checkpointing."""
    variants = {
        "plain": {"use_remove_padding": False},
        "packed_checkpointed": {"use_remove_padding": True, "enable_gradient_checkpointing": True},
    }
    data = None
    for name, model in variants.items():
        # Adam's first step is lr * g / (|g| + eps): with the default eps the rounding noise of a near-zero
        # gradient (the two variants sum in different orders) flips whole steps; eps=1e-4 keeps it smooth.
        config = lora_config(tiny_model_dir, eps=1e-4, **model)
        group = make_group(pool_1, ActorRolloutRefWorker, config, "actor_rollout")
        try:
            if data is None:
                data = _training_batch(group, seed=10)
            metrics = group.update_actor(data)
            assert metrics[0]["grad_norm"] > 0
            group.export_hf(str(tmp_path / name))
        finally:
            group.kill()
    plain = load_file(tmp_path / "plain" / "lora_adapter" / "adapter_model.safetensors")
    other = load_file(tmp_path / "packed_checkpointed" / "lora_adapter" / "adapter_model.safetensors")
    assert plain.keys() == other.keys() and len(plain) == 28
    for key in plain:
        torch.testing.assert_close(other[key], plain[key], atol=1e-5, rtol=0, msg=key)
    assert any(float(plain[k].abs().max()) > 0 for k in plain if ".lora_B." in k)  # B moved off zero
