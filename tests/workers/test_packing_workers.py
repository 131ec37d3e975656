"""Packed forwards and token-budget micro-batches through the Ray worker groups: 2 ranks with uneven
tokens per rank give the same log-probs and the same update as 1 rank on padded fixed micro-batches."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from tests.packing.test_packed_forward import rollout_batch
from tests.workers.helpers import actor_config, make_group
from workers.fsdp import ActorRolloutRefWorker

# The first rank's rows are long, the second's short: per-rank loss normalisation would differ from global.
PROMPTS = [9, 8, 9, 7, 2, 3, 1, 2]
RESPONSES = [12, 11, 12, 10, 2, 1, 3, 2]


def _batch():
    data = rollout_batch(PROMPTS, RESPONSES, seed=7)
    generator = torch.Generator().manual_seed(8)
    shape = data.batch["responses"].shape
    data.batch["old_log_probs"] = -4.0 + 0.5 * torch.randn(shape, generator=generator)
    data.batch["advantages"] = torch.randn(len(data), 1, generator=generator).expand(shape).contiguous()
    return data


def _group(pool, model_dir: str, packed_budget: bool):
    dynamic = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 25} if packed_budget else {}
    config = actor_config(
        model_dir,
        model={"use_remove_padding": packed_budget},
        # Adam's first step is lr * g / (|g| + eps): with the default eps a near-zero gradient's rounding
        # noise flips whole steps; eps=1e-4 keeps the update a smooth function of the gradient.
        actor={"ppo_mini_batch_size": len(PROMPTS), "ppo_micro_batch_size_per_gpu": 2, "loss_agg_mode": "token-mean",
               "optim": {"eps": 1e-4}, **dynamic},
        rollout={"log_prob_use_dynamic_bsz": packed_budget, "log_prob_max_token_len_per_gpu": 25},
    )
    return make_group(pool, ActorRolloutRefWorker, config, "actor_rollout")


def test_two_ranks_token_budget_packed_equal_one_rank_fixed_padded(pool_1, pool_2, tiny_model_dir, tmp_path):
    data = _batch()
    results = {}
    for name, pool, packed_budget in (("padded", pool_1, False), ("packed", pool_2, True)):
        group = _group(pool, tiny_model_dir, packed_budget)
        try:
            results[name] = group.compute_log_prob(data)
            group.update_actor(data)
            group.export_hf(str(tmp_path / name))
        finally:
            group.kill()
    mask = data.batch["response_mask"].bool()
    for key in ("old_log_probs", "entropys"):
        torch.testing.assert_close(results["packed"].batch[key][mask], results["padded"].batch[key][mask], atol=1e-5, rtol=0)
    padded, packed = load_file(tmp_path / "padded" / "model.safetensors"), load_file(tmp_path / "packed" / "model.safetensors")
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert max(float((padded[k] - initial[k]).abs().max()) for k in padded) > 1e-4
    for key in padded:
        torch.testing.assert_close(packed[key], padded[key], atol=1e-5, rtol=0, msg=key)
    config = (tmp_path / "packed" / "config.json").read_text()
    assert "packed_" not in config  # the export loads anywhere: no packed attention name in it
