"""The FSDP actor's LoRA adapter starts from the config's seed (the same adapter for the same seed, on every
rank and in every build), and the merged export is `W + scaling·B·A` computed in float32, rounded once."""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.workers.helpers import actor_config, make_group
from workers.fsdp import ActorRolloutRefWorker
from workers.fsdp.lora_export import ADAPTER_SUBDIR, ADAPTER_WEIGHTS, merged_state
from workers.lora.model import add_lora_adapters
from workers.lora.spec import LoraSpec, peft_tensor_name

SPEC = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear", exclude_modules=None)


def adapter_built_here(model_dir: str, seed: int) -> dict[str, torch.Tensor]:
    """The adapter factors `add_lora_adapters` gives the checkpoint in this process, in PEFT's names."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    add_lora_adapters(model, SPEC, seed)
    return {peft_tensor_name(n): p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n}


def test_the_adapter_init_depends_on_the_seed_only(tiny_model_dir):
    torch.manual_seed(123)
    rng_before = torch.random.get_rng_state()
    first = adapter_built_here(tiny_model_dir, seed=3)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG stream is untouched
    torch.manual_seed(999)  # whatever the global RNG holds, the seed decides
    again = adapter_built_here(tiny_model_dir, seed=3)
    other = adapter_built_here(tiny_model_dir, seed=4)
    factors_a = [n for n in first if ".lora_A." in n]
    assert factors_a and first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert all(not torch.equal(first[n], other[n]) for n in factors_a)
    assert all(not t.any() for n, t in first.items() if ".lora_B." in n)


def test_the_actor_draws_its_adapter_from_the_config_seed(pool_2, tiny_model_dir, tmp_path):
    lora = {"lora_rank": SPEC.rank, "lora_alpha": SPEC.alpha, "target_modules": SPEC.target_modules}
    group = make_group(pool_2, ActorRolloutRefWorker, actor_config(tiny_model_dir, model=lora, seed=5), "actor_rollout_ref")
    try:
        group.export_hf(str(tmp_path / "hf"))  # before any update: the adapter as initialized (2 ranks, gathered)
    finally:
        group.kill()
    actor = load_file(os.path.join(tmp_path, "hf", ADAPTER_SUBDIR, ADAPTER_WEIGHTS))
    expected, seed_0 = adapter_built_here(tiny_model_dir, seed=5), adapter_built_here(tiny_model_dir, seed=0)
    assert actor.keys() == expected.keys()
    assert all(torch.equal(actor[n], expected[n]) for n in actor)
    assert any(not torch.equal(actor[n], seed_0[n]) for n in actor if ".lora_A." in n)  # not a fixed default seed


def test_the_merged_export_is_the_exact_sum_rounded_once():
    generator = torch.Generator().manual_seed(0)
    prefix = "model.layers.0.self_attn.q_proj"
    base = (0.02 * torch.randn(96, 64, generator=generator)).to(torch.bfloat16)
    a, b = 0.1 * torch.randn(4, 64, generator=generator), 0.1 * torch.randn(96, 4, generator=generator)
    state = {f"{prefix}.base_layer.weight": base, f"{prefix}.lora_A.default.weight": a, f"{prefix}.lora_B.default.weight": b}
    merged = merged_state(state, SPEC)
    exact = (base.float() + SPEC.scaling * (b @ a)).to(torch.bfloat16)
    assert list(merged) == [f"{prefix}.weight"] and merged[f"{prefix}.weight"].dtype == torch.bfloat16
    assert torch.equal(merged[f"{prefix}.weight"], exact)
    # 1 + 2^-8 + 2^-20 rounds up to 1 + 2^-7 in bf16; a delta rounded to bf16 first would lose the 2^-20
    # and leave the midpoint, which rounds (half to even) down to 1.
    one = {f"{prefix}.base_layer.weight": torch.ones(1, 1, dtype=torch.bfloat16),
           f"{prefix}.lora_A.default.weight": torch.ones(1, 1),
           f"{prefix}.lora_B.default.weight": torch.full((1, 1), (2.0**-8 + 2.0**-20) / SPEC.scaling)}
    assert merged_state(one, SPEC)[f"{prefix}.weight"].item() == 1 + 2.0**-7
