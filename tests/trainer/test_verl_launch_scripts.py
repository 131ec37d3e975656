"""verl's example launch scripts (tests/trainer/verl_launch_scripts.py) as written, with only the model and data
paths changed, through `python -m trainer.main ... trainer.plan_only=true`: the config, every pre-Ray check and the
memory plan of the script's own sizes and GPU counts, nothing started. Each is accepted (exit 0) or refused with
one `error:` line naming why; none reaches Ray. verl's GRPO script also trains two steps on the tiny model."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.trainer.verl_launch_scripts import SCRIPTS
from trainer.main import main

# A 7B-class shape (Qwen2-7B's config.json fields the plan reads): the scripts' models, without weights.
QWEN_7B = dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, tie_word_embeddings=False, max_position_embeddings=32768)
# Qwen3-30B-A3B's shape (128 experts of 768, 8 active): the mixture-of-experts scripts' model.
QWEN3_30B_A3B = dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                     moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                     tie_word_embeddings=False, max_position_embeddings=40960)
MOE_SCRIPTS = ("megatron_moe_96gb", "megatron_moe_router_replay")
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "reward_model.model.path")
DATA_KEYS = {"data.train_files": "train", "data.val_files": "val"}

# What each script gets here: the refused ones, with what their message names. The rest are accepted.
SGLANG = "actor_rollout_ref.rollout.name=sglang: SGLang is not a rollout engine here"
EXPECTED_REFUSALS: dict[str, str] = {"multi_turn": SGLANG, "sglang": SGLANG}


def multi_turn_config(folder: Path) -> Path:
    """The user yaml verl's multi-turn script names with --config-path / --config-name (its keys, written here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gsm8k_multiturn_grpo.yaml").write_text(textwrap.dedent("""\
        hydra:
          searchpath:
            - file://verl/trainer/config
        defaults:
          - ppo_trainer
          - _self_
        data:
          max_prompt_length: 1024
          max_response_length: 1024
          train_batch_size: 256
          return_raw_chat: True
        actor_rollout_ref:
          hybrid_engine: True
          rollout:
            name: sglang
            multi_turn:
              enable: True
              max_assistant_turns: 5
        """))
    return folder


@pytest.fixture(scope="module")
def small_assets(tmp_path_factory) -> dict[str, str]:
    from trainer.datasets.synthetic import write_synthetic_dataset

    train, val = write_synthetic_dataset(tmp_path_factory.mktemp("verl_data"), train_size=64, val_size=16, seed=0)
    return {"train": str(train), "val": str(val)}


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("verl_7b")
    (folder / "config.json").write_text(json.dumps(QWEN_7B))
    return folder


@pytest.fixture(scope="module")
def moe_model_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("verl_30b_a3b")
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    return folder


def adapted(name: str, model: Path, assets: dict[str, str], out: Path) -> list[str]:
    """The script's arguments with the model and data paths replaced, planned only."""
    args = []
    for arg in SCRIPTS[name][1]:
        key, _, value = arg.partition("=")
        if key in MODEL_KEYS:
            arg = f"{key}={model}"
        elif key in DATA_KEYS:
            arg = f"{key}={assets[DATA_KEYS[key]]}"
        elif key == "trainer.nnodes":  # one node of 8 GPUs: the GPU counts may change
            arg = "trainer.nnodes=1"
        elif key == "trainer.n_gpus_per_node" and not value:  # the script reads it from the environment
            arg = "trainer.n_gpus_per_node=8"
        elif key == "--config-path":
            arg = f"--config-path={multi_turn_config(out / 'config')}"
        args.append(arg)
    return [*args, f"trainer.default_local_dir={out / 'run'}", "trainer.plan_only=true", "trainer.gpu_memory_gib=80"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_verl_script_is_accepted_or_refused_in_one_line(
    name, no_ray, small_assets, model_folder, moe_model_folder, tmp_path, capsys
):
    code = main(adapted(name, moe_model_folder if name in MOE_SCRIPTS else model_folder, small_assets, tmp_path))
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    if name in EXPECTED_REFUSALS:
        assert code == 2 and len(errors) == 1, captured.err  # one message (a line per setting when several)
        assert EXPECTED_REFUSALS[name] in captured.err
    else:
        assert code == 0, captured.err
        assert captured.out.startswith("memory plan per GPU")


# The sizes a tiny model on two CPU workers needs (the issue allows them), and two steps.
TINY_SIZES = {
    "data.train_batch_size": "8", "data.max_prompt_length": "64", "data.max_response_length": "8",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "8", "trainer.n_gpus_per_node": "2",
}


@pytest.mark.slow
def test_verls_grpo_script_trains_two_steps(ray_cluster, tiny_assets, tmp_path, monkeypatch):
    """verl's GRPO example (vLLM hybrid engine of tensor parallel 2 shared by the two ranks, KL loss, offloaded
    reference, wandb) on the tiny model for two steps, with every sync checked."""
    from trainer.config_loader import load_config
    from trainer.main import run

    monkeypatch.setenv("WANDB_MODE", "offline")  # the script logs to wandb: no account here
    args = []
    for arg in SCRIPTS["grpo"][1]:
        key = arg.partition("=")[0]
        if key in TINY_SIZES:
            arg = f"{key}={TINY_SIZES[key]}"
        elif key in MODEL_KEYS:
            arg = f"{key}={tiny_assets['model']}"
        elif key in DATA_KEYS:
            arg = f"{key}={tiny_assets[DATA_KEYS[key]]}"
        args.append(arg)
    cfg = load_config([*args, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=2",
                       "actor_rollout_ref.rollout.verify_sync=true"])
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2 and cfg.actor_rollout_ref.rollout.n == 5
    history = run(cfg)
    assert [record["step"] for record in history] == [0, 1, 2] and "val/reward_mean" in history[0]  # val_before_train
    for record in history[1:]:
        assert record["rollout/logprob_gap_max"] < 1e-3, record  # each rank's rows came back to it
        assert record["actor/kl_loss"] >= 0  # use_kl_loss with the reference
    assert history[2]["rollout/sync_logprob_max_diff"] <= 1e-3  # the second step's sync of the trained weights
