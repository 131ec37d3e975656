"""One PPO update with token-budget micro-batches on packed forwards gives the same weights as fixed
micro-batches on padded forwards, for every loss aggregation mode (CPU, fp32, one rank in this process)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.packing.test_packed_forward import rollout_batch
from workers.config import actor_rollout_ref_config
from workers.fsdp.backend import FSDPBackend
from workers.rl_math.names import LOSS_AGG_MODES
from workers.training.actor_loss import actor_forward, actor_loss
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates

PROMPTS = [9, 3, 6, 2, 7, 4, 9, 5]
RESPONSES = [12, 2, 5, 9, 1, 12, 3, 7]
BUDGET = 22  # tokens per micro-batch: groups of uneven row counts


def update_batch():
    data = rollout_batch(PROMPTS, RESPONSES, seed=3)
    generator = torch.Generator().manual_seed(4)
    shape = data.batch["responses"].shape
    data.batch["old_log_probs"] = -4.0 + 0.5 * torch.randn(shape, generator=generator)
    data.batch["advantages"] = torch.randn(len(data), 1, generator=generator).expand(shape).contiguous()
    data.batch["ref_log_prob"] = -4.0 + 0.5 * torch.randn(shape, generator=generator)
    return data


def updated_weights(model_dir: str, mode: str, packed: bool, dynamic: bool) -> dict[str, torch.Tensor]:
    config = actor_rollout_ref_config({
        "model": {"path": model_dir, "use_remove_padding": packed},
        "actor": {
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
            "ppo_mini_batch_size": len(PROMPTS),
            "ppo_micro_batch_size_per_gpu": 2,
            "use_dynamic_bsz": dynamic,
            "ppo_max_token_len_per_gpu": BUDGET,
            "loss_agg_mode": mode,
            "entropy_coeff": 0.01,
            "use_kl_loss": True,
        },
    })
    actor_cfg = config["actor"]
    engine = FSDPBackend(AutoModelForCausalLM, config["model"], 0, optim_cfg=actor_cfg["optim"])
    schedule = PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0)

    def loss_fn(outputs, micro):
        return actor_loss(outputs, micro, actor_cfg)

    run_ppo_updates(engine, update_batch(), actor_forward(actor_cfg, 1.0), loss_fn, schedule, "update_actor")
    return {name: p.detach().full_tensor().clone() for name, p in engine.module.named_parameters()}


def test_the_token_budget_makes_uneven_micro_batches():
    from workers.training.micro_batching import MicroBatching

    micros, order = MicroBatching(2, BUDGET).split(update_batch(), torch.device("cpu"))
    sizes = [len(m) for m in micros]
    tokens = [int(m.batch["attention_mask"].sum()) for m in micros]
    assert sorted(order) == list(range(len(PROMPTS))) and sum(sizes) == len(PROMPTS)
    assert max(tokens) <= BUDGET and len(set(sizes)) > 1 and len(micros) != len(PROMPTS) // 2


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_token_budget_packed_update_equals_fixed_padded_update(model_dir, process_group, mode):
    fixed = updated_weights(model_dir, mode, packed=False, dynamic=False)
    budget = updated_weights(model_dir, mode, packed=True, dynamic=True)
    initial = {k: p.detach() for k, p in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}
    assert max(float((fixed[k] - initial[k]).abs().max()) for k in fixed) > 1e-4  # the step changed something
    for name in fixed:
        torch.testing.assert_close(budget[name], fixed[name], atol=1e-5, rtol=0, msg=name)
