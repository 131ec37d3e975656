"""Strategy and inference settings: bad input names the key and what is valid (no Ray needed)."""

import pytest

from workers.strategy.config import InferenceConfig, StrategyConfig, optimizer_settings, scheduler_settings
from workers.strategy.inference import engine_groups


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: StrategyConfig.parse({"backend": "deepspeed"}), r"backend 'deepspeed' is not available; valid: \['fsdp2', 'megatron'\]"),
        (lambda: StrategyConfig.parse({"bakend": "fsdp2"}), r"unknown keys \['bakend'\]; valid keys: \['backend'"),
        (lambda: StrategyConfig.parse({"dtype": "fp8"}), r"dtype 'fp8' is not valid"),
        (lambda: StrategyConfig.parse({"logits_chunk_tokens": -1}), r"logits_chunk_tokens must be an int >= 0 \(0: full logits\), got -1"),
        (lambda: StrategyConfig.parse({"megatron": {"pipeline_model_parallel_size": 2}}), r"pipeline_model_parallel_size=2: the strategy supports 1"),
        (lambda: StrategyConfig.parse({"backend": "megatron", "megatron": {"moe_aux_loss_coeff": "0.01"}}), r"moe_aux_loss_coeff must be a number >= 0, got '0.01'"),
        (lambda: StrategyConfig.parse({"backend": "megatron", "megatron": {"moe_z_loss_coeff": 0}}), r"moe_z_loss_coeff must be None \(no z-loss\) or a number > 0, got 0"),
        (lambda: StrategyConfig.parse({"backend": "megatron", "megatron": {"moe_router_dtype": "bf16"}}), r"moe_router_dtype 'bf16' is not valid; valid: None, fp32, fp64"),
        (lambda: StrategyConfig.parse({"router_aux_loss_coef": -0.1}), r"router_aux_loss_coef must be None \(off\) or a number >= 0, got -0.1"),
        (lambda: StrategyConfig.parse({"megatron": {"moe_z_loss_coeff": 0.001}}), r"megatron.moe_z_loss_coeff act on megatron-core's routers \(backend megatron\); with backend fsdp2 set router_aux_loss_coef"),
        (lambda: StrategyConfig.parse({"backend": "megatron", "router_aux_loss_coef": 0.01, "megatron": {"moe_aux_loss_coeff": 0.01}}), r"two coefficients of one loss"),
        (lambda: InferenceConfig.parse({"group_size": 2}), r"needs model_path"),
        (lambda: InferenceConfig.parse({"model_path": "/m", "kv_cache_gib": 0}), r"inference kv_cache_gib must be None \(sized within gpu_memory_utilization\) or a number > 0 \(GiB\), got 0$"),
        (lambda: InferenceConfig.parse({"model_path": "/m", "kv_cache_gib": "4"}), r"inference kv_cache_gib must be None .* got '4'$"),
        (lambda: optimizer_settings({"learning_rate": 1e-5}), r"optimizer settings: unknown keys \['learning_rate'\]; valid keys: \['betas', 'eps', 'lr', 'weight_decay'\]"),
        (lambda: scheduler_settings({"warmup": 3}), r"scheduler settings: unknown keys \['warmup'\]"),
        (lambda: engine_groups(4, 3), r"group_size=3 must divide the strategy's 4 ranks \(valid: \[1, 2, 4\]\)"),
    ],
)
def test_bad_settings_name_what_is_valid(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_settings_fill_defaults_and_parse_nested_megatron():
    config = StrategyConfig.parse({"backend": "megatron", "megatron": {"tensor_model_parallel_size": 2}})
    assert config.megatron.tensor_model_parallel_size == 2 and config.grad_clip == 1.0
    assert optimizer_settings({"lr": 1e-5})["betas"] == (0.9, 0.999)
    assert engine_groups(4, 2) == [[0, 1], [2, 3]]


def test_the_engine_api_passes_a_fixed_kv_cache_size_to_the_engine():
    import torch

    from workers.rollout.vllm_options import device_options

    assert InferenceConfig.parse({"model_path": "/m"}).vllm_rollout_options()["kv_cache_gib"] is None
    options = InferenceConfig.parse({"model_path": "/m", "kv_cache_gib": 4}).vllm_rollout_options()
    assert device_options(options, torch.device("cuda"), sleep=True)["kv_cache_memory_bytes"] == 4 << 30
