"""Ulysses sequence parallelism through the Ray worker groups: 2 ranks sharing every sequence (k=2) give
the log-probs, entropies, reference log-probs, values, update metrics and updated weights of 1 rank (k=1),
within float32 noise on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from recipes.pair_batch import pack_pairs
from tests.workers.helpers import actor_config, make_group, update_batch
from workers.fsdp import ActorRolloutRefWorker, CriticWorker

# Token-budget micro-batches of 26 tokens hold 21+4 = 25, 21+4 = 25, 19+4 = 23 and 17+5 = 22 tokens (the
# longest-first spread of workers/packing/token_budget.py): odd totals, padded to a multiple of k=2.
PROMPTS = [9, 8, 9, 7, 2, 3, 1, 2]
RESPONSES = [12, 11, 12, 10, 3, 1, 3, 2]
MICRO_BATCH_TOKENS = 26
ATOL = 1e-5


def _actor_group(pool, model_dir: str, size: int):
    """Micro-batches of MICRO_BATCH_TOKENS tokens: the budget is per GPU, so k=2 sets half of it (13 tokens,
    below the longest sequence's 21: it holds them only because 2 GPUs share each micro-batch). k=2 also
    checkpoints its layers (recomputed with their all-to-alls in backward)."""
    budget = MICRO_BATCH_TOKENS // size
    dynamic = {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": budget}
    config = actor_config(
        model_dir,
        model={"use_remove_padding": True, "enable_gradient_checkpointing": size > 1},
        # Adam's first step is lr * g / (|g| + eps): eps=1e-4 keeps it a smooth function of the gradient.
        actor={"ppo_mini_batch_size": len(PROMPTS), "loss_agg_mode": "token-mean", "optim": {"eps": 1e-4},
               "entropy_coeff": 0.01, "use_kl_loss": True, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": budget,
               "ulysses_sequence_parallel_size": size},
        rollout=dynamic,
        ref=dynamic,
    )
    return make_group(pool, ActorRolloutRefWorker, config, "actor_rollout_ref")


def _run_then_export(group, export_dir: Path, *calls):
    """Each call's result on the group, then its HF export to `export_dir`; the group is killed either way."""
    try:
        results = [call(group) for call in calls]
        group.export_hf(str(export_dir))
        return results
    finally:
        group.kill()


def _assert_close_on(mask: torch.Tensor, got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got[mask], expected[mask], atol=ATOL, rtol=0)


def _assert_weights_match(updated: Path, reference: Path, initial: str) -> None:
    ours, theirs = load_file(updated / "model.safetensors"), load_file(reference / "model.safetensors")
    start = load_file(f"{initial}/model.safetensors")
    assert max(float((theirs[k] - start[k]).abs().max()) for k in theirs if k in start) > 1e-4  # the step moved them
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], atol=ATOL, rtol=0, msg=key)


def test_actor_and_reference_with_two_ranks_per_sequence_equal_one_rank(pool_1, pool_2, tiny_model_dir, tmp_path):
    data = update_batch(PROMPTS, RESPONSES)
    results = {}
    for size, pool in ((1, pool_1), (2, pool_2)):
        old, ref, metrics = _run_then_export(
            _actor_group(pool, tiny_model_dir, size), tmp_path / f"k{size}",
            lambda g: g.compute_log_prob(data), lambda g: g.compute_ref_log_prob(data), lambda g: g.update_actor(data),
        )
        # One data-parallel group either way: one output, from the group's first rank.
        assert len(metrics) == 1, metrics
        results[size] = (old, ref, metrics[0])
    mask = data.batch["response_mask"].bool()
    (old_1, ref_1, metrics_1), (old_2, ref_2, metrics_2) = results[1], results[2]
    for key in ("old_log_probs", "entropys"):
        _assert_close_on(mask, old_2.batch[key], old_1.batch[key])
    _assert_close_on(mask, ref_2.batch["ref_log_prob"], ref_1.batch["ref_log_prob"])
    assert torch.all(old_2.batch["old_log_probs"][~mask] == 0)
    for key in ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl_loss", "grad_norm"):
        assert metrics_2[key] == pytest.approx(metrics_1[key], abs=ATOL), key
    assert metrics_1["grad_norm"] > 1e-3
    _assert_weights_match(tmp_path / "k2", tmp_path / "k1", tiny_model_dir)


def test_dpo_update_with_two_ranks_per_sequence_equals_one_rank(pool_1, pool_2, tiny_model_dir, tmp_path):
    """Pairs of a group are counted once: the same loss, metrics, pair count and updated weights (a weight-0
    padding pair included)."""
    data = update_batch(PROMPTS, RESPONSES)
    half = len(PROMPTS) // 2
    pairs = pack_pairs(data, np.arange(half), np.arange(half, 2 * half))
    generator = torch.Generator().manual_seed(9)
    pairs.batch["chosen_ref_logps"] = -30.0 + torch.randn(half, generator=generator)
    pairs.batch["rejected_ref_logps"] = -30.0 + torch.randn(half, generator=generator)
    pairs.batch["weight"][-1] = 0.0
    pairs.meta_info["dpo"] = {"beta": 0.5, "loss_type": "sigmoid"}
    results = {}
    for size, pool in ((1, pool_1), (2, pool_2)):
        group = _actor_group(pool, tiny_model_dir, size)
        try:
            metrics = group.update_actor_dpo(pairs)
            group.export_hf(str(tmp_path / f"k{size}"))
        finally:
            group.kill()
        assert len(metrics) == 1, metrics
        results[size] = metrics[0]
    assert results[1]["pairs"] == results[2]["pairs"] == half - 1
    for key in ("loss", "accuracy", "margin", "chosen_logps", "rejected_logps", "grad_norm"):
        assert results[2][key] == pytest.approx(results[1][key], abs=ATOL), key
    _assert_weights_match(tmp_path / "k2", tmp_path / "k1", tiny_model_dir)


@pytest.fixture(scope="module")
def four_head_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 with 4 attention heads and 2 key/value heads: k=2 splits both (no repeat)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.workers.conftest import TINY_CONFIG

    path = tmp_path_factory.mktemp("tiny_qwen2_four_heads")
    torch.manual_seed(1)
    config = Qwen2Config(**{**TINY_CONFIG, "num_attention_heads": 4, "num_key_value_heads": 2})
    Qwen2ForCausalLM(config).save_pretrained(path)
    assert json.loads((path / "config.json").read_text())["num_key_value_heads"] == 2
    return str(path)


def test_critic_with_two_ranks_per_sequence_equals_one_rank(pool_1, pool_2, four_head_model_dir, tmp_path):
    data = update_batch(PROMPTS, RESPONSES)
    results = {}
    for size, pool in ((1, pool_1), (2, pool_2)):
        config = {
            "model": {"path": four_head_model_dir, "use_remove_padding": True},
            "optim": {"lr": 1e-3, "eps": 1e-4},
            "ppo_mini_batch_size": len(PROMPTS),
            "ppo_micro_batch_size_per_gpu": 3,
            "forward_micro_batch_size_per_gpu": 3,
            "ulysses_sequence_parallel_size": size,
        }
        values, metrics = _run_then_export(
            make_group(pool, CriticWorker, config), tmp_path / f"k{size}",
            lambda g: g.compute_values(data), lambda g: g.update_critic(data),
        )
        assert len(metrics) == 1, metrics
        results[size] = (values, metrics[0])
    mask = data.batch["response_mask"].bool()
    _assert_close_on(mask, results[2][0].batch["values"], results[1][0].batch["values"])
    for key in ("vf_loss", "vpred_mean", "grad_norm"):  # the same micro-batches of 3 rows: every metric agrees
        assert results[2][1][key] == pytest.approx(results[1][1][key], abs=ATOL), key
    _assert_weights_match(tmp_path / "k2", tmp_path / "k1", four_head_model_dir)
