"""When the update and the forward passes hand the allocator's free blocks back (trainer.release_cached_blocks):
after every micro-batch, or only once the phase's last micro-batch is done. The check itself is CUDA's
(tests/workers/test_cached_blocks.py); here each call is counted as if it had released."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import workers.cached_blocks as cached_blocks
import workers.training.forward_pass as forward_pass
import workers.training.ppo_loop as ppo_loop
from tests.packing.test_update_equivalence import BUDGET, PROMPTS, update_batch
from workers.cached_blocks_limit import AFTER_MICRO_BATCH, AFTER_PHASE
from workers.config import actor_rollout_ref_config
from workers.fsdp.backend import FSDPBackend
from workers.training.actor_loss import actor_forward, actor_loss
from workers.training.backend import ResponseForward
from workers.training.forward_pass import forward_rows, response_log_probs
from workers.training.micro_batching import MicroBatching
from workers.training.ppo_loop import PPOSchedule, run_ppo_updates


@pytest.fixture
def counted_releases(monkeypatch):
    """Every release check counts as a release, from the default point (whatever an earlier test in this process
    left); the process's release point is restored after the test."""
    calls: list[str] = []
    cached_blocks.set_release_point(AFTER_MICRO_BATCH)

    def release(device: torch.device, limit: int = 0) -> bool:
        calls.append(device.type)
        return True

    for module in (cached_blocks, ppo_loop, forward_pass):
        monkeypatch.setattr(module, "release_cached_blocks", release)
    yield calls
    cached_blocks.set_release_point(AFTER_MICRO_BATCH)


def _update(model_dir: str) -> tuple[dict[str, float], int, FSDPBackend]:
    config = actor_rollout_ref_config({
        "model": {"path": model_dir, "use_remove_padding": True},
        "actor": {"optim": {"lr": 1e-3}, "ppo_mini_batch_size": len(PROMPTS), "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": BUDGET},
    })
    actor_cfg = config["actor"]
    engine = FSDPBackend(AutoModelForCausalLM, config["model"], 0, optim_cfg=actor_cfg["optim"])
    schedule = PPOSchedule.from_config(actor_cfg, 1, 1, "actor", 0, 0)
    micros, _ = schedule.micro_batching().split(update_batch(), engine.device)

    def loss_fn(outputs, micro):
        return actor_loss(outputs, micro, actor_cfg)

    metrics = run_ppo_updates(engine, update_batch(), actor_forward(actor_cfg, 1.0), loss_fn, schedule, "update_actor")
    return metrics, len(micros), engine


def test_the_default_checks_after_every_micro_batch_and_after_the_phase(model_dir, process_group, counted_releases):
    metrics, micros, _ = _update(model_dir)
    assert micros > 1
    assert metrics["cached_block_releases"] == micros + 1 == len(counted_releases)


def test_after_phase_checks_once_per_update_and_once_per_forward_pass(model_dir, process_group, counted_releases):
    cached_blocks.set_release_point(AFTER_PHASE)
    metrics, micros, engine = _update(model_dir)
    assert micros > 1 and metrics["cached_block_releases"] == 1 == len(counted_releases)
    outputs = forward_rows(engine, update_batch(), MicroBatching(2, None), ResponseForward("log_probs"), response_log_probs)
    assert len(outputs["log_probs"]) == len(PROMPTS) and len(counted_releases) == 2  # four micro-batches, one check


def test_a_release_point_set_for_a_block_is_undone_after_it_even_if_it_raises(model_dir, process_group, counted_releases):
    with pytest.raises(RuntimeError, match="cut short"):
        with cached_blocks.release_point_during(AFTER_PHASE):
            raise RuntimeError("cut short")
    metrics, micros, _ = _update(model_dir)
    assert metrics["cached_block_releases"] == micros + 1  # back at every micro-batch


def test_a_release_point_outside_the_choices_is_refused_with_them():
    with pytest.raises(ValueError, match=r"release_cached_blocks='sometimes' is not valid; choose one of \['after_micro_batch', 'after_phase'\]"):
        cached_blocks.set_release_point("sometimes")
