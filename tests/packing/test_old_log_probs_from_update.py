"""Without the old log-prob pass (one optimizer step per batch) the update takes pi_old from its own forward:
the same weights and the same importance-sampling and engine-gap figures as the pass gives (CPU, fp32, one
rank in this process); an update of several optimizer steps refuses a batch without old log-probs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from protocol import DataProto
from tests.packing.test_packed_forward import rollout_batch
from trainer.config_loader import ConfigError, load_config
from trainer.old_log_prob_pass import old_log_prob_pass_needed
from workers.config import actor_rollout_ref_config
from workers.fsdp.backend import FSDPBackend
from workers.fsdp.sequences import response_log_probs_and_entropy
from workers.rl_math.rollout_correction import ROLLOUT_IS_WEIGHTS, logprob_gap_metrics, truncated_is_weights
from workers.training.actor_loss import actor_forward, actor_loss
from workers.training.ppo_loop import PPOSchedule, check_one_optimizer_step, run_ppo_updates

PROMPTS = [9, 3, 6, 2, 7, 4]
RESPONSES = [12, 2, 5, 9, 1, 12]
CAP = 1.5


def make_engine(model_dir: str, mini_batch: int) -> tuple[FSDPBackend, dict]:
    config = actor_rollout_ref_config({
        "model": {"path": model_dir},
        "actor": {"optim": {"lr": 1e-2, "weight_decay": 0.0}, "ppo_mini_batch_size": mini_batch,
                  "ppo_micro_batch_size_per_gpu": 2, "use_kl_loss": False},
    })
    actor_cfg = config["actor"]
    return FSDPBackend(AutoModelForCausalLM, config["model"], 0, optim_cfg=actor_cfg["optim"]), actor_cfg


def update_batch() -> DataProto:
    data = rollout_batch(PROMPTS, RESPONSES, seed=5)
    generator = torch.Generator().manual_seed(6)
    shape = data.batch["responses"].shape
    data.batch["advantages"] = torch.randn(len(data), 1, generator=generator).expand(shape).contiguous()
    # An engine whose log-probs differ from the trainer's: some tokens' ratios pass the cap.
    data.batch["rollout_log_probs"] = -4.0 + 0.5 * torch.randn(shape, generator=generator)
    return data


def update(model_dir: str, data: DataProto, with_pass: bool) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    engine, actor_cfg = make_engine(model_dir, len(PROMPTS))
    metrics: dict[str, float] = {}
    if with_pass:  # what the driver does with the pass: pi_old, then the weights and the gap from it
        with torch.no_grad():
            old, _ = response_log_probs_and_entropy(engine.module, data, engine.device, 1.0, with_entropy=False)
        data = data.union(DataProto.from_dict({"old_log_probs": old}))
        mask = data.batch["response_mask"]
        data.batch[ROLLOUT_IS_WEIGHTS], metrics = truncated_is_weights(old, data.batch["rollout_log_probs"], mask, CAP)
        metrics |= logprob_gap_metrics(old, data.batch["rollout_log_probs"], mask)
    schedule = PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0)
    metrics |= run_ppo_updates(
        engine, data, actor_forward(actor_cfg, 1.0), lambda out, m: actor_loss(out, m, actor_cfg, CAP), schedule, "update_actor"
    )
    return {name: p.detach().full_tensor().clone() for name, p in engine.module.named_parameters()}, metrics


def test_the_update_stands_in_for_the_pass(model_dir, process_group):
    before = {name: p.detach().clone() for name, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}
    with_pass, pass_metrics = update(model_dir, update_batch(), with_pass=True)
    from_update, update_metrics = update(model_dir, update_batch(), with_pass=False)
    moved = max(float((with_pass[n] - before[n]).abs().max()) for n in before)
    assert moved > 1e-4  # the step changed the weights, so equality below says something
    for name in with_pass:
        torch.testing.assert_close(from_update[name], with_pass[name], rtol=1e-5, atol=1e-6)
    # The figures the driver logs from the pass come from the update, extremes as extremes.
    assert pass_metrics["rollout_is/capped_fraction"] > 0 and pass_metrics["rollout_is/ratio_max"] > CAP
    for key in ("rollout_is/ratio_max", "rollout_is/ratio_min", "rollout/logprob_gap_max"):
        assert update_metrics[key] == pytest.approx(pass_metrics[key], rel=1e-5), key
    for key in ("rollout_is/weight_mean", "rollout/logprob_gap_mean"):  # means over micro-batches: close, not equal
        assert update_metrics[key] == pytest.approx(pass_metrics[key], rel=0.2), key
    assert update_metrics["pg_clipfrac"] == 0.0 and update_metrics["ppo_kl"] == 0.0  # the ratio is 1 by construction


def test_several_optimizer_steps_need_the_pass(model_dir, process_group):
    engine, actor_cfg = make_engine(model_dir, len(PROMPTS) // 2)
    schedule = PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0)
    actor_cfg = make_engine(model_dir, len(PROMPTS))[1]
    check_one_optimizer_step(PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0), len(PROMPTS))
    with pytest.raises(ValueError, match=r"2 mini-batch\(es\) of 3 rows.*compute_log_prob.*ppo_epochs=1"):
        check_one_optimizer_step(schedule, len(PROMPTS))


@pytest.mark.parametrize(
    "overrides, needed",
    [
        (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"], False),
        (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"], True),
        (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_epochs=2"], True),
        (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "algorithm.use_kl_in_reward=true"], True),
        (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.strategy=megatron"], True),
        (["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.old_log_prob_pass=always"], True),
    ],
)
def test_when_the_pass_runs(overrides, needed):
    assert old_log_prob_pass_needed(load_config(overrides)) is needed


def test_an_unknown_setting_names_the_choices():
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.actor.old_log_prob_pass' must be one of \['auto', 'always'\], got 'never'"):
        load_config(["actor_rollout_ref.actor.old_log_prob_pass=never"])
