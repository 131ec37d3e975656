"""`update_actor_dpo` on 2 Ray workers: metrics over an odd number of pairs, and the generator (the same
actor worker) samples from the updated weights right after the update."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from protocol import DataProto
from recipes.pair_batch import pack_pairs, pad_for_ranks, sequence_log_probs
from tests.workers.helpers import actor_config, make_group, random_prompts
from workers.fsdp import ActorRolloutRefWorker

RESPONSE_LENGTH = 6
TARGET = [5, 6, 7, 8, 9, 10]  # the chosen response of every pair


@pytest.fixture(scope="module")
def actor(pool_2, tiny_model_dir):
    config = actor_config(tiny_model_dir, actor={"optim": {"lr": 1e-2}}, rollout={"response_length": RESPONSE_LENGTH, "do_sample": False})
    group = make_group(pool_2, ActorRolloutRefWorker, config, "actor_rollout_ref")
    yield group
    group.kill()


def with_response(rows: DataProto, tokens: list[int]) -> DataProto:
    """The same prompts with `tokens` as a full-length response."""
    out = rows.select(deepcopy=True)
    response = torch.tensor(tokens).expand(len(rows), -1).clone()
    out.batch["responses"], out.batch["response_mask"] = response, torch.ones_like(response)
    out.batch["input_ids"][:, -RESPONSE_LENGTH:] = response
    out.batch["attention_mask"][:, -RESPONSE_LENGTH:] = 1
    return out


def pair_batch(actor, greedy: DataProto) -> DataProto:
    """Pairs (TARGET response, current greedy response) with reference log-probs, padded for 2 ranks."""
    both = DataProto.concat([with_response(greedy, TARGET), greedy])
    rows = np.arange(len(greedy))
    pairs = pack_pairs(both, rows, rows + len(greedy))
    ref = sequence_log_probs(actor.compute_ref_log_prob(both).batch["ref_log_prob"], both.batch["response_mask"])
    pairs.batch["chosen_ref_logps"], pairs.batch["rejected_ref_logps"] = ref[: len(greedy)], ref[len(greedy) :]
    pairs = pad_for_ranks(pairs, actor.world_size)
    pairs.meta_info["dpo"] = {"beta": 0.5, "loss_type": "sigmoid"}
    return pairs


def test_dpo_updates_reach_the_generator(actor):
    prompts = random_prompts(3, [3, 5], seed=4)
    greedy_before = actor.generate_sequences(prompts)
    pairs = pair_batch(actor, greedy_before)
    assert len(pairs) == 4 and pairs.batch["weight"].tolist() == [1.0, 1.0, 1.0, 0.0]

    first = actor.update_actor_dpo(pairs)
    assert len(first) == 2 and first[0] == first[1]  # metrics are global (all ranks agree)
    metrics = first[0]
    assert metrics["pairs"] == 3  # the weight-0 padding row is not counted
    assert metrics["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference before the first step
    assert metrics["accuracy"] == 0.0 and metrics["margin"] == pytest.approx(0.0, abs=1e-5)
    for _ in range(7):
        metrics = actor.update_actor_dpo(pairs)[0]
    assert metrics["accuracy"] == 1.0 and metrics["margin"] > 0 and metrics["loss"] < math.log(2)

    # The generator is this actor: its next greedy responses move off the rejected ones, toward TARGET.
    greedy_after = actor.generate_sequences(prompts)
    assert not torch.equal(greedy_after.batch["responses"], greedy_before.batch["responses"])
    log_probs = actor.compute_log_prob(with_response(greedy_before, TARGET)).batch["old_log_probs"].sum(-1)
    ref = actor.compute_ref_log_prob(with_response(greedy_before, TARGET)).batch["ref_log_prob"].sum(-1)
    assert (log_probs > ref + 1.0).all()
