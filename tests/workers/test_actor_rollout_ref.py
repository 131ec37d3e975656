"""ActorRolloutRefWorker on 2 Ray workers (and 1 for comparisons): generation, log-probs, PPO updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from protocol import DataProto
from tests.workers.helpers import (
    EOS,
    PAD,
    actor_config,
    hf_response_log_probs,
    left_padded_prompts,
    make_group,
    random_prompts,
)
from workers.fsdp import ActorRolloutRefWorker

RESPONSE_LENGTH = 24
TARGET = 7  # the token the update test rewards


@pytest.fixture(scope="module")
def actor_group(pool_2, tiny_model_dir):
    config = actor_config(
        tiny_model_dir,
        actor={"use_kl_loss": True, "kl_loss_coef": 0.01, "entropy_coeff": 0.001},
        rollout={"response_length": RESPONSE_LENGTH},
    )
    group = make_group(pool_2, ActorRolloutRefWorker, config, "actor_rollout_ref")
    yield group
    group.kill()


def _single_worker_group(pool_1, model_dir: str, micro_batch: int):
    config = actor_config(
        model_dir,
        actor={"ppo_micro_batch_size_per_gpu": micro_batch},
        rollout={"response_length": RESPONSE_LENGTH},
    )
    return make_group(pool_1, ActorRolloutRefWorker, config, "actor_rollout")


@pytest.fixture(scope="module")
def single_group(pool_1, tiny_model_dir):
    group = _single_worker_group(pool_1, tiny_model_dir, micro_batch=4)
    yield group
    group.kill()


def test_generate_shapes_masks_and_carried_fields(actor_group):
    prompts = random_prompts(6, [3, 5, 7], seed=1)
    prompts.non_tensor_batch["uid"] = np.array(list("abcdef"), dtype=object)
    prompts.meta_info["step"] = 3
    out = actor_group.generate_sequences(prompts)
    batch, prompt_len, length = 6, 7, RESPONSE_LENGTH
    assert out.batch["prompts"].shape == (batch, prompt_len)
    assert out.batch["responses"].shape == (batch, length)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert out.batch[key].shape == (batch, prompt_len + length)
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"])
    assert torch.equal(out.batch["input_ids"], torch.cat([prompts.batch["input_ids"], out.batch["responses"]], 1))
    mask = out.batch["response_mask"]
    assert torch.equal(out.batch["attention_mask"], torch.cat([prompts.batch["attention_mask"], mask], 1))
    last_prompt_pos = prompts.batch["position_ids"][:, -1:]
    assert torch.equal(out.batch["position_ids"][:, prompt_len:], last_prompt_pos + torch.arange(1, length + 1))
    for row in range(batch):
        valid = int(mask[row].sum())
        assert torch.all(mask[row, :valid] == 1) and torch.all(mask[row, valid:] == 0)
        responses = out.batch["responses"][row]
        assert not torch.any(responses[: valid - 1] == EOS)  # the mask ends at the first EOS
        if valid < length:
            assert responses[valid - 1] == EOS and torch.all(responses[valid:] == PAD)
    assert list(out.non_tensor_batch["uid"]) == list("abcdef") and out.meta_info["step"] == 3


def test_greedy_left_padded_batch_matches_each_prompt_alone(actor_group, single_group):
    generator = torch.Generator().manual_seed(2)
    tokens = [torch.randint(3, 64, (n,), generator=generator).tolist() for n in (2, 6, 4)]
    batched = actor_group.generate_sequences(left_padded_prompts(tokens, {"do_sample": False}))
    for row, prompt in enumerate(tokens):
        alone = single_group.generate_sequences(left_padded_prompts([prompt], {"do_sample": False}))
        assert torch.equal(batched.batch["responses"][row], alone.batch["responses"][0]), row
        assert torch.equal(batched.batch["response_mask"][row], alone.batch["response_mask"][0])
    assert len({tuple(r.tolist()) for r in batched.batch["responses"]}) == len(tokens)


def test_uneven_eos_across_ranks_does_not_hang(actor_group):
    """One row per rank, near-uniform sampling: a rank whose row hit EOS must keep stepping with the other."""
    prompts = random_prompts(2, [4], seed=3)
    prompts.meta_info["temperature"] = 50.0
    for _ in range(20):
        lengths = actor_group.generate_sequences(prompts).batch["response_mask"].sum(1).tolist()
        if min(lengths) < RESPONSE_LENGTH and lengths[0] != lengths[1]:
            return  # one rank finished early and the call still completed
    pytest.fail("no call had ranks finishing at different steps; raise the temperature or the length")


def test_ignore_eos_runs_every_response_to_full_length(pool_1, tiny_model_dir):
    """rollout.ignore_eos: HF generate does not stop at EOS, EOS stays a scored token of the response."""
    from transformers import AutoModelForCausalLM

    config = actor_config(tiny_model_dir, rollout={"response_length": RESPONSE_LENGTH, "ignore_eos": True})
    group = make_group(pool_1, ActorRolloutRefWorker, config, "actor_rollout")
    try:
        prompts = random_prompts(16, [3, 5], seed=10)
        prompts.meta_info.update(temperature=50.0, seed=4)  # near-uniform over 64 tokens: EOS is sampled often
        out = group.generate_sequences(prompts)
        log_probs = group.compute_log_prob(out).batch["old_log_probs"]
    finally:
        group.kill()
    assert out.batch["response_mask"].sum(1).tolist() == [RESPONSE_LENGTH] * 16
    eos = out.batch["responses"] == EOS
    assert eos[:, :-1].any()  # some response went on past an EOS
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    # scored at the sampling temperature (carried in meta_info), every position included
    torch.testing.assert_close(log_probs, hf_response_log_probs(reference, out, 50.0), atol=1e-5, rtol=0)


def test_meta_info_seed_makes_sampling_reproducible(actor_group):
    def sample(seed: int) -> torch.Tensor:
        prompts = random_prompts(4, [3, 5], seed=8)
        prompts.meta_info["seed"] = seed
        return actor_group.generate_sequences(prompts).batch["responses"]

    first = sample(11)
    actor_group.generate_sequences(random_prompts(2, [4], seed=9))  # moves the workers' global RNG
    assert torch.equal(sample(11), first)
    assert not torch.equal(sample(12), first)


def test_log_probs_match_plain_hf_model_and_ref(actor_group, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    data = actor_group.generate_sequences(random_prompts(5, [2, 7, 4], seed=4))
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    actor = actor_group.compute_log_prob(data)
    assert actor.batch["old_log_probs"].shape == actor.batch["entropys"].shape == (5, RESPONSE_LENGTH)
    # Packed forwards (the default) score real response tokens only: padding positions hold 0.
    real = data.batch["response_mask"].bool()
    assert not real.all()  # some rows stopped early, so padding is covered
    torch.testing.assert_close(actor.batch["old_log_probs"][real], hf_response_log_probs(reference, data)[real], atol=1e-5, rtol=0)
    assert torch.all(actor.batch["entropys"][real] > 0)
    ref = actor_group.compute_ref_log_prob(data)
    torch.testing.assert_close(ref.batch["ref_log_prob"], actor.batch["old_log_probs"], atol=1e-5, rtol=0)
    data.meta_info["temperature"] = 0.7
    hot = actor_group.compute_log_prob(data).batch["old_log_probs"]
    torch.testing.assert_close(hot[real], hf_response_log_probs(reference, data, 0.7)[real], atol=1e-5, rtol=0)


def target_batch(prompts: DataProto, valid_lengths: list[int]) -> DataProto:
    """Responses made of TARGET tokens (then EOS) with the given valid lengths."""
    batch, length = len(prompts), RESPONSE_LENGTH
    mask = (torch.arange(length)[None] < torch.tensor(valid_lengths)[:, None]).long()
    responses = torch.where(mask.bool(), torch.full((batch, length), TARGET), torch.full((batch, length), PAD))
    positions = prompts.batch["position_ids"]
    return DataProto.from_dict({
        "prompts": prompts.batch["input_ids"],
        "responses": responses,
        "input_ids": torch.cat([prompts.batch["input_ids"], responses], 1),
        "attention_mask": torch.cat([prompts.batch["attention_mask"], mask], 1),
        "position_ids": torch.cat([positions, positions[:, -1:] + torch.arange(1, length + 1)], 1),
        "response_mask": mask,
    })


def _mean_target_log_prob(group, data: DataProto) -> float:
    mask = data.batch["response_mask"].float()
    return float((group.compute_log_prob(data).batch["old_log_probs"] * mask).sum() / mask.sum())


def test_update_actor_raises_log_prob_of_rewarded_token(actor_group):
    data = target_batch(random_prompts(8, [3, 6], seed=5), [24, 5, 12, 1, 20, 8, 3, 16])
    data = data.union(actor_group.compute_ref_log_prob(data))
    start = _mean_target_log_prob(actor_group, data)
    for _ in range(3):
        step = data.union(actor_group.compute_log_prob(data))
        step.batch["advantages"] = step.batch["response_mask"].float()
        metrics = actor_group.update_actor(step)
    assert len(metrics) == 2 and metrics[0] == metrics[1]  # averaged over ranks: every rank reports the same
    expected = {"pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl_loss", "grad_norm", "lr"}
    assert expected <= set(metrics[0]) and all(isinstance(v, float) for v in metrics[0].values())
    assert metrics[0]["lr"] == pytest.approx(1e-3) and metrics[0]["kl_loss"] > 0
    assert metrics[0]["cached_block_releases"] == 0.0  # the CPU has no caching allocator to empty
    assert _mean_target_log_prob(actor_group, data) > start + 0.5


def test_grad_accumulation_matches_one_micro_batch(single_group, pool_1, tiny_model_dir, tmp_path):
    """One worker, one optimizer step on 4 rows: 1 micro-batch of 4 == 2 micro-batches of 2."""
    data = target_batch(random_prompts(4, [2, 5], seed=6), [24, 3, 10, 7])
    data.batch["old_log_probs"] = torch.full(data.batch["responses"].shape, -4.0)
    data.batch["advantages"] = torch.linspace(-1, 1, 4)[:, None].expand(-1, RESPONSE_LENGTH).contiguous()
    two_micro = _single_worker_group(pool_1, tiny_model_dir, micro_batch=2)
    try:
        for name, group in (("one", single_group), ("two", two_micro)):
            group.update_actor(data)
            group.export_hf(str(tmp_path / name))
    finally:
        two_micro.kill()
    one, two = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    initial = load_file(f"{tiny_model_dir}/model.safetensors")
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(one[key], two[key], atol=1e-5, rtol=0, msg=key)
    assert max(float((one[k] - initial[k]).abs().max()) for k in one) > 1e-4  # the step changed something
