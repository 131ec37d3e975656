"""The `7b-2gpu` preset of benchmarks/peers (the issue "[Side by side at 7B]"), checked on CPU without running a
side: every side gets the same 7B-on-2-GPUs work, our memory plan fits it on an H200 (not an H100), TRL is
refused with its reason, and the table puts every side's phases in MFU by one count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.e2e_step import engine_overrides
from benchmarks.gpu_grpo_step import grpo_overrides
from benchmarks.model_shapes import QWEN2_7B
from benchmarks.peers.compare import compare_folders
from benchmarks.peers.gpu_settings import PRESETS, ours_overrides
from benchmarks.peers.gpu_sides import Plan, side_command
from benchmarks.peers.verl_gpu import parse_limits, parse_sides
from benchmarks.peers.verl_settings import verl_overrides
from benchmarks.random_model import write_config
from trainer.config_loader import load_config
from trainer.flops import ModelFlops
from trainer.memory_plan import GIB, build_plan, plan_setup
from trainer.memory_plan.engine_concurrency import engine_concurrency
from trainer.memory_plan.shape import ModelShape

PRESET = PRESETS["7b-2gpu"]
WORK = Path("/w")


def as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.lstrip("+").split("=", 1) for item in overrides)


def test_every_side_gets_the_issue_workload():
    s = PRESET.settings
    assert (s.size, s.gpus, s.prompts_per_step, s.generations, s.max_prompt_length, s.max_response_length) == ("7B", 2, 32, 8, 512, 1024)
    verl = as_dict(verl_overrides(WORK / "m", WORK / "t", WORK / "v", WORK, 3, s))
    for side in ("ours_padded", "ours_packed"):
        ours = as_dict(ours_overrides(s, side))
        shared = {k: v for k, v in ours.items() if k in verl}
        assert len(shared) >= 25 and all(verl[k] == v for k, v in shared.items())
    expected = {
        "trainer.n_gpus_per_node": "2", "data.train_batch_size": "32", "actor_rollout_ref.rollout.n": "8",
        "data.max_prompt_length": "512", "data.max_response_length": "1024", "actor_rollout_ref.rollout.ignore_eos": "true",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "32",  # one optimizer step per batch
        "actor_rollout_ref.actor.use_kl_loss": "true", "actor_rollout_ref.model.enable_gradient_checkpointing": "true",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4", "actor_rollout_ref.model.use_remove_padding": "false",
    }
    assert {k: verl[k] for k in expected} == expected
    assert verl["actor_rollout_ref.rollout.enforce_eager"] == "false"  # CUDA graphs
    assert verl["actor_rollout_ref.actor.fsdp_config.param_offload"] == "false"


def test_our_plan_fits_an_h200_not_an_h100(tmp_path):
    """Our sides' config passes the config checks, and the memory plan (what a GPU run checks before starting)
    fits 2 H200s (139.8 GiB each) with nothing offloaded; an H100's 79.6 GiB does not hold it."""
    write_config(tmp_path / "model", QWEN2_7B)
    base = grpo_overrides(tmp_path, tmp_path / "t.parquet", tmp_path / "v.parquet", 3, "[jsonl]") + engine_overrides("vllm", False)
    for side in ("ours_padded", "ours_packed"):
        cfg = load_config(base + ours_overrides(PRESET.settings, side))
        assert cfg.trainer.n_gpus_per_node == 2 and not cfg.actor_rollout_ref.actor.fsdp_config.param_offload
        assert build_plan(cfg, int(139.8 * GIB)).fits() is True
        assert build_plan(cfg, int(79.6 * GIB)).fits() is False


def test_the_4_gpu_preset_is_the_2_gpu_run_over_4_and_fits_h100s(tmp_path):
    """The issue's item 5: the same run, FSDP over 4 GPUs; half the per-GPU state, so 4 H100s hold it."""
    four = PRESETS["7b-4gpu"]
    assert four.settings == replace(PRESET.settings, gpus=4) and four.limits_s == PRESET.limits_s
    write_config(tmp_path / "model", QWEN2_7B)
    base = grpo_overrides(tmp_path, tmp_path / "t.parquet", tmp_path / "v.parquet", 3, "[jsonl]") + engine_overrides("vllm", False)
    for side in ("ours_padded", "ours_packed"):
        cfg = load_config(base + ours_overrides(four.settings, side))
        assert cfg.trainer.n_gpus_per_node == 4
        assert build_plan(cfg, int(79.6 * GIB)).fits() is True


def test_the_model_folder_names_its_architecture(tmp_path):
    """verl's workers read the model class from config.json's `architectures` (its absence stopped verl's side
    before its first step on 4 H200s, 2026-11-27)."""
    write_config(tmp_path, QWEN2_7B)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]


def test_sides_and_limits(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert PRESET.sides == ("verl", "ours_padded", "ours_packed")
    with pytest.raises(SystemExit, match="trl: TRL's GRPOTrainer runs in one process"):
        parse_sides("verl,trl", PRESET)
    assert parse_limits(["verl=1200"], PRESET)["verl"] == 1200.0
    plan = Plan(WORK, WORK / "out", 3, PRESET.settings)
    commands = {side: side_command(side, plan) for side in PRESET.sides}
    assert all(c.env["CUDA_VISIBLE_DEVICES"] == "0,1" for c in commands.values())
    ours = commands["ours_padded"].command
    assert ours[ours.index("--sizes") + 1] == "7B" and "--reuse-model" in ours  # the folder written once for all
    assert str(WORK / "7B" / "model") in " ".join(commands["verl"].command)


def test_tiny_keeps_the_structure():
    tiny = PRESET.settings.tiny()
    assert (tiny.size, tiny.gpus, tiny.gradient_checkpointing, tiny.micro_batch) == ("tiny", 2, True, 4)
    assert tiny.max_prompt_length + tiny.max_response_length <= 512  # the tiny shape's positions
    assert tiny.prompts_per_update == tiny.prompts_per_step  # still one optimizer step per batch


def test_dry_run_of_the_preset(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.peers.verl_gpu", "--preset", "7b-2gpu", "--dry-run", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert [line.split(" ")[0] for line in done.stdout.splitlines()[::2]] == ["verl", "ours_padded", "ours_packed"]
    assert "limit 900 s" in done.stdout and "trainer.n_gpus_per_node=2" in done.stdout and "CUDA_VISIBLE_DEVICES=0,1" in done.stdout
    assert not list(tmp_path.iterdir())


def _tiny_config() -> dict:
    return dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=100, tie_word_embeddings=False)


def test_table_mfu_by_one_count(tmp_path):
    """setup.json gives every side's phases an MFU from the same FLOP count; each side's own figure is kept apart."""
    settings = PRESET.settings.as_dict() | {"prompts_per_step": 2, "generations": 2}
    setup = {"preset": "7b-2gpu", "gpus": 2, "device": "NVIDIA H200", "peak_tflops": 1e-6, "settings": settings,
             "model_config": _tiny_config()}
    (tmp_path / "setup.json").write_text(json.dumps(setup))
    ours = [{"timing/wall_step_s": 9.0, "timing/update_actor_s": 2.0, "timing/generate_s": 1.0, "perf/tokens": 400.0,
             "response/length_mean": 64.0, "perf/mfu/update_actor": 0.3} for _ in range(3)]
    (tmp_path / "ours_padded_e2e.json").write_text(json.dumps({"results": [{"history": ours}]}))
    verl = [{"step": i, "data": {"timing_s/step": 20.0, "timing_s/update_actor": 4.0, "timing_s/gen": 3.0, "perf/total_num_tokens": 400.0,
                                  "response_length/mean": 64.0, "perf/mfu/actor": 0.2}} for i in (1, 2, 3)]
    (tmp_path / "verl_metrics.jsonl").write_text("\n".join(json.dumps(r) for r in verl))
    table = compare_folders([tmp_path])
    flops = ModelFlops(ModelShape.from_config(_tiny_config()))
    update = flops.train([100.0] * 4).total  # 400 tokens over 2 x 2 sequences
    assert table["rows"]["mfu_update_actor"]["ours_padded"] == pytest.approx(update / (2.0 * 2 * 1e-6 * 1e12))
    assert table["rows"]["mfu_update_actor"]["verl"] == pytest.approx(update / (4.0 * 2 * 1e-6 * 1e12))
    assert table["rows"]["reported_mfu_update_actor"] == {"ours_padded": 0.3, "verl": 0.2}
    assert table["rows"]["tokens_per_s_per_gpu"]["verl"] == pytest.approx(400 / 20 / 2)
    names = list(table["rows"])
    assert names.index("mfu_update_actor") == names.index("update_actor_s") + 1  # beside its time
    assert table["setup"]["device"] == "NVIDIA H200"


@pytest.mark.parametrize("name, shape", [("14b-4gpu", "14B"), ("32b-lora-4gpu", "32B")])
def test_bigger_presets_plan_on_four_h200s(tmp_path, name, shape):
    """The four-GPU presets above 7B: our packed side's config passes the checks with the preset's own overrides
    (16K-token budget; LoRA and a TP2 engine at 32B), and the memory plan fits 4 H200s. 32B trained in full
    (the same run without LoRA) does not."""
    from benchmarks.e2e_step import SHAPES

    preset = PRESETS[name]
    assert (preset.settings.size, preset.settings.gpus, preset.sides) == (shape, 4, ("ours_packed",))
    write_config(tmp_path / "model", SHAPES[shape])
    base = grpo_overrides(tmp_path, tmp_path / "t.parquet", tmp_path / "v.parquet", 3, "[jsonl]") + engine_overrides("vllm", False)
    cfg = load_config(base + ours_overrides(preset.settings, "ours_packed") + list(preset.ours_extra))
    assert cfg.trainer.n_gpus_per_node == 4 and cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 16384
    assert build_plan(cfg, int(139.8 * GIB)).fits() is True
    if shape == "32B":
        assert cfg.actor_rollout_ref.model.lora_rank == 64 and cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
        full = [o for o in preset.ours_extra if "lora" not in o and "target_modules" not in o]
        assert build_plan(load_config(base + ours_overrides(preset.settings, "ours_packed") + full), int(139.8 * GIB)).fits() is False


def test_the_14b_h100_preset_fits_80_gb_with_every_sequence_of_a_step_in_the_engine_at_once(tmp_path):
    """Four H100s (79.1 GiB each): the H200 preset's plan does not fit, and its engine share of 0.4 would leave a KV
    cache of a few sequences after the weights and vLLM's start-up profile (generation in waves); the H100 one
    (optimizer state offloaded, a larger engine share, max_num_seqs at the step's 64 per engine) fits, and its
    engines hold all 64 sequences at once."""
    from benchmarks.e2e_step import SHAPES

    write_config(tmp_path / "model", SHAPES["14B"])
    base = grpo_overrides(tmp_path, tmp_path / "t.parquet", tmp_path / "v.parquet", 3, "[jsonl]") + engine_overrides("vllm", False)
    h100 = int(79.1 * GIB)
    configs = {
        name: load_config(base + ours_overrides(PRESETS[name].settings, "ours_packed") + list(PRESETS[name].ours_extra))
        for name in ("14b-4gpu", "14b-4gpu-h100")
    }
    plans = {name: build_plan(cfg, h100) for name, cfg in configs.items()}
    assert plans["14b-4gpu"].fits() is False and plans["14b-4gpu-h100"].fits() is True
    h200_engine = engine_concurrency(plan_setup(configs["14b-4gpu"], on_gpu=True), h100)
    h100_engine = engine_concurrency(plan_setup(configs["14b-4gpu-h100"], on_gpu=True), h100)
    assert 0 < h200_engine.at_once < 8 and h200_engine.waves > 1
    assert h100_engine.per_step == 64 and h100_engine.waves == 1
    assert plans["14b-4gpu-h100"].peak()[1].total < 76 * GIB


def test_the_preset_overrides_reach_our_side_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.peers.verl_gpu", "--preset", "32b-lora-4gpu", "--dry-run",
                           "--out-dir", str(tmp_path), "--ours-extra", "trainer.seed=3"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "actor_rollout_ref.model.lora_rank=64" in done.stdout and "CUDA_VISIBLE_DEVICES=0,1,2,3" in done.stdout
    assert done.stdout.index("lora_rank=64") < done.stdout.index("trainer.seed=3")  # the command line's come last
