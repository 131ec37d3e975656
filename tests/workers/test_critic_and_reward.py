"""CriticWorker and RewardModelWorker on 2 Ray workers."""

from __future__ import annotations

import pytest
import torch

from tests.workers.conftest import TINY_CONFIG
from tests.workers.helpers import make_group, random_prompts
from workers.fsdp import CriticWorker, RewardModelWorker

RESPONSE_LENGTH = 6


def rollout_batch(batch: int, valid_lengths: list[int], seed: int):
    """Prompt + response token ids (no model needed): tokens in 3..63, never the pad id."""
    prompts = random_prompts(batch, [3, 5], seed=seed)
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(RESPONSE_LENGTH)[None] < torch.tensor(valid_lengths)[:, None]).long()
    responses = torch.randint(3, 64, (batch, RESPONSE_LENGTH), generator=generator) * mask
    positions = prompts.batch["position_ids"]
    prompts.batch["responses"] = responses
    prompts.batch["response_mask"] = mask
    prompts.batch["input_ids"] = torch.cat([prompts.batch["input_ids"], responses], 1)
    prompts.batch["attention_mask"] = torch.cat([prompts.batch["attention_mask"], mask], 1)
    prompts.batch["position_ids"] = torch.cat([positions, positions[:, -1:] + torch.arange(1, RESPONSE_LENGTH + 1)], 1)
    return prompts


# critic.model.fsdp_config off, and on (on CPU the moves are only counted: the critic must train the same way).
@pytest.fixture(scope="module", params=[False, True], ids=["resident", "offload"])
def critic_group(request, pool_2, tiny_model_dir):
    offload = {"param_offload": request.param, "optimizer_offload": request.param}
    config = {
        "model": {"path": tiny_model_dir, "fsdp_config": offload},
        "optim": {"lr": 3e-3},
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 1,
        "forward_micro_batch_size_per_gpu": 3,
        "cliprange_value": 10.0,
    }
    group = make_group(pool_2, CriticWorker, config)
    yield group
    group.kill()


def test_values_shape_and_update_toward_constant_returns(critic_group, request):
    offload = request.node.callspec.params["critic_group"]
    data = rollout_batch(6, [6, 2, 4, 1, 5, 3], seed=0)
    values = critic_group.compute_values(data).batch["values"]
    assert values.shape == (6, RESPONSE_LENGTH) and values.dtype == torch.float32
    assert torch.all(values[data.batch["response_mask"] == 0] == 0)
    data.batch["returns"] = torch.full(values.shape, 0.5)
    losses = []
    for step_index in range(4):
        step = data.union(critic_group.compute_values(data))
        metrics = critic_group.update_critic(step)
        assert {"vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "lr"} <= set(metrics[0])
        losses.append(metrics[0]["vf_loss"])
        _check_offload_moves(metrics[0], offload, step_index)
    assert losses[-1] < 0.5 * losses[0], losses


def _check_offload_moves(metrics: dict[str, float], offload: bool, step_index: int) -> None:
    """The critic's residency (workers/fsdp/residency.py): with no other tenant in its process its parameters
    come back once, for the first values after its start, and stay; its Adam state comes for each step only.
    Each update reports the moves since the previous one (the first: the start and two values passes)."""
    moves = {k: v for k, v in metrics.items() if k.startswith("offload/")}
    if not offload:
        assert moves == {}
        return
    assert moves["offload/values/critic_params_moves"] == (1 if step_index == 0 else 0)
    assert moves["offload/update_critic/critic_params_moves"] == 0
    optimizer_moves = moves["offload/update_critic/critic_optimizer_moves"]
    assert optimizer_moves >= 2 and optimizer_moves % 2 == 0  # in before each step, out after it
    assert moves["offload/update_critic/h2d_gib"] == 0  # on CPU nothing is copied
    if step_index == 0:
        assert moves["offload/critic_init/critic_params_moves"] == 1


def test_critic_checkpoint_round_trip(critic_group, tmp_path):
    data = rollout_batch(4, [6, 3, 2, 5], seed=1)
    data.batch["returns"] = torch.full(data.batch["responses"].shape, -0.5)
    critic_group.save_checkpoint(str(tmp_path))
    saved = critic_group.compute_values(data).batch["values"]
    critic_group.update_critic(data.union(critic_group.compute_values(data)))
    assert not torch.allclose(critic_group.compute_values(data).batch["values"], saved, atol=1e-4)
    critic_group.load_checkpoint(str(tmp_path))
    torch.testing.assert_close(critic_group.compute_values(data).batch["values"], saved, atol=1e-6, rtol=0)


def test_reward_model_scores_last_valid_token(pool_2, tmp_path):
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    torch.manual_seed(1)
    reference = Qwen2ForSequenceClassification(Qwen2Config(**TINY_CONFIG, num_labels=1)).eval()
    reference.save_pretrained(tmp_path)
    group = make_group(pool_2, RewardModelWorker, {"model": {"path": str(tmp_path)}, "micro_batch_size_per_gpu": 2})
    try:
        data = rollout_batch(5, [6, 1, 3, 4, 2], seed=2)
        scores = group.compute_rm_score(data).batch["rm_scores"]
    finally:
        group.kill()
    last = data.batch["response_mask"].sum(1) - 1
    assert scores.shape == (5, RESPONSE_LENGTH)
    assert torch.count_nonzero(scores) == 5 and torch.all(scores[torch.arange(5), last] != 0)
    with torch.no_grad():  # no real token equals the pad id here, so HF's own pooling picks the same token
        expected = reference(
            input_ids=data.batch["input_ids"],
            attention_mask=data.batch["attention_mask"],
            position_ids=data.batch["position_ids"],
        ).logits[:, 0]
    torch.testing.assert_close(scores[torch.arange(5), last], expected, atol=1e-5, rtol=0)
