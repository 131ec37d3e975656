"""RAFT: the selection and the SFT batch (no Ray), `update_actor_sft` against a local NLL on real workers,
and a short `recipes.raft` run whose NLL falls and reward rises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protocol import DataProto
from recipes.sft_batch import sft_batch
from tests.workers.helpers import actor_config, make_group
from trainer.algorithms.selection import best_per_prompt
from workers.fsdp import ActorRolloutRefWorker


def test_best_per_prompt_keeps_the_best_above_the_threshold():
    scores = [0.2, 0.9, 0.4, 0.1, 0.3, 0.0, 0.6]
    kept, left_out = best_per_prompt(scores, np.array(list("aabbbcc"), dtype=object), min_score=0.5)
    assert kept.tolist() == [1, 6] and left_out == 1  # prompt b's best (0.4) is below 0.5
    kept, left_out = best_per_prompt(torch.tensor([1.0, 1.0]), ["x", "x"], min_score=1.0)
    assert kept.tolist() == [0] and left_out == 0  # ties: the first row; the threshold is inclusive
    with pytest.raises(ValueError, match="same length"):
        best_per_prompt([1.0], ["a", "b"], 0.0)


def rollout_batch(rows: int, prompt: int = 3, response: int = 4, seed: int = 0) -> DataProto:
    ids = torch.randint(3, 60, (rows, prompt + response), generator=torch.Generator().manual_seed(seed))
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(prompt + response).repeat(rows, 1),
        "responses": ids[:, prompt:], "response_mask": torch.ones(rows, response, dtype=torch.long),
    })


def test_sft_batch_pads_with_untrained_rows():
    batch = sft_batch(rollout_batch(5), np.array([4, 1, 2]), world_size=2)
    assert batch.batch["loss_mask"].sum(-1).tolist() == [4, 4, 4, 0]  # per token, like response_mask
    assert torch.equal(batch.batch["input_ids"][:3], rollout_batch(5).batch["input_ids"][[4, 1, 2]])
    assert "uid" not in batch.non_tensor_batch


def local_token_nll(model_dir: str, data: DataProto) -> float:
    """Token-mean NLL of the trained response tokens, by a plain HF forward pass."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    length = data.batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], position_ids=data.batch["position_ids"]).logits[:, -length - 1 : -1]
    nll = -torch.log_softmax(logits.float(), -1).gather(-1, data.batch["responses"][..., None])[..., 0]
    mask = data.batch["response_mask"] * data.batch["loss_mask"][:, None]
    return float((nll * mask).sum() / mask.sum())


def test_update_actor_sft_is_the_masked_nll_and_lowers_it(pool_2, tiny_model_dir):
    group = make_group(pool_2, ActorRolloutRefWorker, actor_config(tiny_model_dir, actor={"optim": {"lr": 1e-2}}), "actor_rollout")
    data = rollout_batch(4)
    data.batch["loss_mask"] = torch.ones(4)
    # Rank 1's second row is junk that must not count: the expected loss is the mean of the ranks' NLLs
    # over their trained tokens (one micro-batch each).
    data.batch["loss_mask"][3] = 0.0
    data.batch["responses"][3] = 59
    expected = np.mean([local_token_nll(tiny_model_dir, half) for half in data.chunk(2)])
    history = [group.update_actor_sft(data)[0] for _ in range(4)]
    assert history[0]["sft_loss"] == pytest.approx(expected, rel=1e-4)  # measured before the first step
    assert history[-1]["sft_loss"] < history[0]["sft_loss"] - 0.5, history
    assert set(history[0]) == {"sft_loss", "grad_norm", "lr", "cached_block_releases"}
    with pytest.raises(Exception, match=r"update_actor_sft needs batch keys .* missing \['responses'"):
        group.update_actor_sft(data.select(batch_keys=["input_ids", "attention_mask", "position_ids", "response_mask"]))


@pytest.mark.slow
def test_raft_lowers_the_nll_and_raises_the_reward(raft_run):
    history, cfg, out = raft_run
    assert [r["step"] for r in history] == list(range(1, 7))
    nll = [r["actor/sft_loss"] for r in history]
    reward = [r["reward/mean"] for r in history]
    assert all(0 < r["raft/kept"] <= cfg.data.train_batch_size for r in history)
    assert np.mean(nll[-2:]) < np.mean(nll[:2]) - 0.2, nll
    assert np.mean(reward[-2:]) > np.mean(reward[:2]) + 0.03, reward
    assert (out / "global_step_6" / "actor").is_dir()
