"""LoRA on a mixture of experts: the merged export folds PEFT's adapters on the fused experts and the router in
(the merged model computes what the adapted one does), and a vLLM rollout that cannot take such an adapter (on
CPU; an expert layout vLLM's split is not checked for) is refused before Ray starts, naming what to set."""

from __future__ import annotations

import json
import shutil

import torch
from transformers import AutoModelForCausalLM

from tests.reliability.conftest import short_run, small_assets  # noqa: F401 - the fixture
from trainer.config_loader import load_config
from trainer.moe_checks import ATTENTION_AND_ROUTER, moe_lora_rollout_problem
from trainer.tiny_model import build_char_tokenizer
from trainer.tiny_moe import build_tiny_moe, build_tiny_moe_config
from workers.fsdp.lora_export import merged_state, wrapped_parameter_deltas
from workers.lora.spec import ADAPTER_NAME, LoraSpec

SPEC = LoraSpec.from_model_config({"lora_rank": 8, "lora_alpha": 16, "target_modules": "all-linear"})


def test_the_merged_moe_computes_what_the_adapted_one_does():
    torch.manual_seed(0)
    config = build_tiny_moe_config(build_char_tokenizer())
    adapted = AutoModelForCausalLM.from_config(config)
    plain_weights = {name: tensor.clone() for name, tensor in adapted.state_dict().items()}
    adapted.add_adapter(SPEC.peft_config(), adapter_name=ADAPTER_NAME)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:  # B starts at zero: give every adapter an effect
                param.normal_(std=0.05)
    state = {name: tensor.detach().clone() for name, tensor in adapted.state_dict().items()}
    deltas = wrapped_parameter_deltas(adapted, state, SPEC, AutoModelForCausalLM)
    assert any(".experts." in name for name in deltas) and any(".mlp.gate." in name for name in deltas)
    merged = merged_state(state, SPEC, deltas)
    assert set(merged) == set(plain_weights)
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(merged, strict=True)
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    assert not torch.equal(merged[experts], plain_weights[experts])  # the experts' adapter is in
    ids = torch.randint(3, 90, (2, 12))
    with torch.no_grad():
        assert torch.allclose(adapted(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-5)


def test_vllm_rollouts_of_a_moe_lora_are_refused_on_cpu_and_for_unchecked_expert_layouts(
    small_assets, tmp_path, monkeypatch  # noqa: F811
):
    moe = build_tiny_moe(tmp_path / "moe")
    lora = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.lora_rank=8")
    on_moe = (*lora, f"actor_rollout_ref.model.path={moe}")
    on_cpu = moe_lora_rollout_problem(load_config(short_run(small_assets, tmp_path, *on_moe)))
    assert on_cpu and on_cpu.endswith("use actor_rollout_ref.rollout.name=hf on CPU")
    monkeypatch.setattr("trainer.moe_checks.visible_gpu_count", lambda: 1)  # as on a GPU node
    # Qwen3-MoE: vLLM splits the fused expert factors itself (tests/workers/test_moe_lora_vllm.py).
    assert moe_lora_rollout_problem(load_config(short_run(small_assets, tmp_path, *on_moe))) is None
    # Another mixture of experts' fused layout is not checked against vLLM's split: its experts are refused.
    other = tmp_path / "other_moe"
    shutil.copytree(moe, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "qwen2_moe"}))
    on_other = (*lora, f"actor_rollout_ref.model.path={other}")
    experts = moe_lora_rollout_problem(load_config(short_run(small_assets, tmp_path, *on_other)))
    assert experts and f"target_modules to the attention and the router, e.g. {ATTENTION_AND_ROUTER}" in experts
    targets = f"actor_rollout_ref.model.target_modules={ATTENTION_AND_ROUTER}"
    assert moe_lora_rollout_problem(load_config(short_run(small_assets, tmp_path, *on_other, targets))) is None
    dense = load_config(short_run(small_assets, tmp_path, *lora))
    assert moe_lora_rollout_problem(dense) is None
