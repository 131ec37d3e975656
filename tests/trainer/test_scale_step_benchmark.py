"""`benchmarks/scale_step.py` runs end to end on CPU at its tiny mixture-of-experts shape (HF generate here, for
speed; the GPU command uses the hybrid vLLM engine, checked by hand with vLLM's CPU build), and puts the memory
plan next to every worker memory reading."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from benchmarks.scale_step import build_parser, main, scale_overrides
from trainer.memory_plan.shape import ModelShape


@pytest.mark.slow
def test_scale_step_tiny_cpu_run(tmp_path):
    out = tmp_path / "scale.json"
    (result,) = main(["--sizes", "tiny-moe", "--layers", "1", "--steps", "2", "--prompts", "2", "--n", "2",
                      "--response-length", "8", "--micro-rows", "2", "--workdir", str(tmp_path / "work"),
                      "--out", str(out),
                      "actor_rollout_ref.rollout.name=hf"])
    assert json.loads(out.read_text())["results"][0]["size"] == "tiny-moe-1L"
    folder = tmp_path / "work" / "tiny-moe-1L" / "model"
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and AutoConfig.from_pretrained(folder).num_experts == 4
    assert result["params"] == ModelShape.from_config(config).total_params()  # the folder holds every weight
    assert "update_actor" in result["plan"] and {r["phase"] for r in result["plan_rows"]} >= {"generate", "update_actor"}
    phases = [m["phase"] for m in result["memory"]]
    assert phases[0] == "init" and "update_actor" in phases
    assert all(m["estimate_gib"] and m["estimate_gib"] > 0 for m in result["memory"])
    assert result["summary"]["timing_step_s"] > 0 and len(result["history"]) == 2
    # offload on CPU: the policy's moves are counted, no bytes move, and no bandwidth is measured
    offload = {row["phase"]: row for row in result["offload"]}
    # One optimizer step per batch: no old log-prob pass (trainer/old_log_prob_pass.py), so no phase of it.
    assert {"init", "ref_log_prob", "update_actor"} <= set(offload) and "old_log_prob" not in offload
    assert all(row["h2d_gib"] == 0 and row["overhead"] is None for row in offload.values())
    assert result["history"][-1]["offload/update_actor/actor_optimizer_moves"] == 2


def test_a_token_budget_replaces_row_micro_batches_in_update_and_log_prob_passes():
    from argparse import Namespace

    from benchmarks.scale_step import scale_overrides

    args = Namespace(prompts=8, n=8, response_length=512, micro_rows=8, gpu_memory_utilization=0.5, eager=False,
                     lora_rank=0, force=False, token_budget=0, log_prob_budget=0, strategy="fsdp")
    assert not any("use_dynamic_bsz" in o for o in scale_overrides(args, on_gpu=True))
    args.token_budget = 16384
    overrides = scale_overrides(args, on_gpu=True)
    assert "actor_rollout_ref.actor.use_dynamic_bsz=true" in overrides
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384" in overrides
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768" in overrides
    args.log_prob_budget = 40960  # a step's 64 rows of up to 608 tokens in one log-prob micro-batch
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=40960" in scale_overrides(args, on_gpu=True)


def test_the_megatron_strategy_runs_padded_with_its_own_offload_switches(tmp_path):
    """`--strategy megatron` swaps FSDP's packing and offload keys (refused with megatron) for verl's Megatron
    switches: the setup loads, passes the actor's checks and plans the 14B run of the issue at TP 2 x DP 2."""
    from benchmarks.model_shapes import QWEN2_14B
    from benchmarks.random_model import write_config
    from trainer.config_loader import load_config
    from trainer.memory_plan import build_plan
    from trainer.role_groups import actor_worker_config
    from workers.config import actor_rollout_ref_config

    args, _ = build_parser().parse_known_args(["--strategy", "megatron", "--prompts", "32", "--response-length", "1024",
                                               "--micro-rows", "4", "--gpu-memory-utilization", "0.4"])
    write_config(tmp_path / "14b", QWEN2_14B)
    overrides = [*scale_overrides(args, on_gpu=True), f"actor_rollout_ref.model.path={tmp_path / '14b'}",
                 "data.max_prompt_length=512", "trainer.n_gpus_per_node=4",
                 "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "actor_rollout_ref.actor.megatron.use_distributed_optimizer=true"]
    cfg = load_config(overrides)
    actor = actor_rollout_ref_config(actor_worker_config(cfg))["actor"]
    assert actor["strategy"] == "megatron" and not actor["fsdp_config"]["param_offload"]
    assert all(actor["megatron"][k] for k in ("param_offload", "grad_offload", "optimizer_offload"))
    assert build_plan(cfg, int(139.8 * (1 << 30))).fits() is True
