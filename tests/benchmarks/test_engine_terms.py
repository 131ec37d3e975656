"""The plan's engine terms beside vLLM's start-up figures: the comparison a GPU scale run prints."""

import json

from benchmarks.engine_terms import measured_terms, planned_terms, print_comparison
from benchmarks.model_shapes import QWEN3_30B_A3B
from trainer.config_loader import load_config

GIB = 1 << 30
# The first step of the 30B-A3B LoRA r16 run on one H200 (2026-12-02, docs/benchmarks.md)
FIRST_STEP = {
    "rollout/engine_memory/weights_gib": 60.051, "rollout/engine_memory/activation_peak_gib": 3.786,
    "rollout/engine_memory/cuda_graphs_gib": 0.252, "rollout/engine_memory/non_torch_gib": 0.09,
    "rollout/engine_memory/kv_cache_gib": 5.721, "rollout/kv_cache_sequences": 102.763, "timing/step_s": 28.8,
}


def test_the_run_and_its_plan_are_compared_term_by_term(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({**QWEN3_30B_A3B, "model_type": "qwen3_moe"}))
    cfg = load_config([
        f"actor_rollout_ref.model.path={tmp_path}", "trainer.device=cuda", "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=8", "data.max_prompt_length=96", "data.max_response_length=512",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.5", "actor_rollout_ref.model.lora_rank=16",
    ])
    planned = planned_terms(cfg, int(139.81 * GIB))
    measured = measured_terms([{"timing/step_s": 1.0}, FIRST_STEP, {}])
    assert set(planned) == set(measured)
    assert measured["cuda_graphs + non_torch"] == 0.252 + 0.09
    for name in ("weights", "activation_peak", "kv_cache"):
        assert abs(planned[name] - measured[name]) / measured[name] < 0.03, name
    print_comparison(planned, measured)
    assert "kv_cache" in capsys.readouterr().out
    assert planned_terms(cfg, None) == {} and measured_terms([{"timing/step_s": 1.0}]) == {}
