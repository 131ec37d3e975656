"""Which finished groups an asynchronous step takes (staleness bound, policies, order) and the prompt feed's
checkpoint state (no prompt lost or repeated across a resume). Pure driver logic, no Ray."""

import pytest

from trainer.async_buffer import GroupBuffer
from trainer.config_loader import ConfigError, load_config
from trainer.data import ResumableBatchSampler
from trainer.data.dataloader import RLDataLoader
from trainer.prompt_feed import PromptFeed


def _buffer(k, policy="wait", batch=2):
    return GroupBuffer(batch_size=batch, max_staleness=k, policy=policy)


def test_takes_the_oldest_groups_first_once_a_batch_is_there():
    buffer = _buffer(k=2)
    buffer.add("a", None, oldest=3, newest=3)
    assert buffer.take(3, {}) is None  # one finished group, batch of two
    buffer.add("b", None, oldest=1, newest=2)
    buffer.add("c", None, oldest=2, newest=3)
    assert [g.uid for g in buffer.take(3, {})] == ["b", "c"]  # by oldest token, not by arrival
    assert list(buffer.groups) == ["a"]


def test_ties_go_by_arrival():
    buffer = _buffer(k=1)
    for uid in "xyz":
        buffer.add(uid, None, oldest=0, newest=0)
    assert [g.uid for g in buffer.take(0, {})] == ["x", "y"]


def test_expired_groups_are_never_taken():
    buffer = _buffer(k=1, policy="drop")
    buffer.add("old", None, oldest=0, newest=1)  # its first token is two versions behind 2
    buffer.add("ok", None, oldest=1, newest=2)
    buffer.add("new", None, oldest=2, newest=2)
    assert [g.uid for g in buffer.expire(2)] == ["old"]
    assert [g.uid for g in buffer.take(2, {})] == ["ok", "new"]
    assert buffer.expire(2) == [] and len(buffer) == 0


@pytest.mark.parametrize("k", [0, 1, 3])
def test_every_group_taken_is_within_the_bound(k):
    buffer = _buffer(k=k, policy="drop", batch=1)
    for oldest in range(8):
        buffer.add(f"g{oldest}", None, oldest=oldest, newest=oldest)
    version = 7
    expired = {g.uid for g in buffer.expire(version)}
    assert expired == {f"g{v}" for v in range(8) if v < version - k}
    while (taken := buffer.take(version, {})) is not None:
        assert all(version - g.oldest <= k for g in taken)


def test_wait_policy_waits_for_a_due_group_still_generating():
    buffer = _buffer(k=1)
    buffer.add("a", None, oldest=2, newest=2)
    buffer.add("b", None, oldest=2, newest=2)
    # "long" started at version 1: after the update at version 2 it would be two behind, so it goes in now.
    assert buffer.take(2, {"long": 1, "fresh": None}) is None
    buffer.add("long", None, oldest=1, newest=2)
    assert [g.uid for g in buffer.take(2, {"fresh": None})] == ["long", "a"]
    buffer.add("c", None, oldest=2, newest=2)
    # A group that started at the current version is not due: no waiting for it.
    assert [g.uid for g in buffer.take(2, {"other": 2})] == ["b", "c"]


@pytest.mark.parametrize("policy", ["drop", "regenerate"])
def test_drop_and_regenerate_never_wait(policy):
    buffer = _buffer(k=1, policy=policy)
    buffer.add("a", None, oldest=2, newest=2)
    buffer.add("b", None, oldest=2, newest=2)
    assert [g.uid for g in buffer.take(2, {"long": 1})] == ["a", "b"]


def test_wait_does_not_wait_when_a_batch_of_due_groups_is_already_there():
    buffer = _buffer(k=0)
    buffer.add("a", None, oldest=3, newest=3)
    buffer.add("b", None, oldest=3, newest=3)
    assert [g.uid for g in buffer.take(3, {"c": 3})] == ["a", "b"]  # c could not fit in this batch anyway


def test_a_group_arriving_twice_is_refused():
    buffer = _buffer(k=1)
    buffer.add("a", None, oldest=0, newest=0)
    with pytest.raises(ValueError, match="arrived twice"):
        buffer.add("a", None, oldest=0, newest=0)


def _feed(size=10, batch=3):
    items = [{"position": i} for i in range(size)]
    return PromptFeed(RLDataLoader(items, ResumableBatchSampler(size, batch, shuffle=False)))


def test_feed_checkpoint_hands_the_open_prompts_out_again_and_skips_the_settled():
    feed = _feed()
    first = feed.take(5)  # pulls two batches: positions 0..5 (5 not handed out yet)
    assert [r.position for r in first] == [0, 1, 2, 3, 4] and len({r.uid for r in first}) == 5
    for ref in first[:3]:
        feed.settle(ref.uid)  # trained on
    feed.requeue(first[4].uid)  # regenerate
    assert feed.outstanding() == 1  # prompt 3 is still out; 4 and 5 wait in the queue
    state, loader_state = feed.state_dict(), feed.loader.state_dict()

    resumed = _feed()
    resumed.loader.load_state_dict(loader_state)
    resumed.load_state_dict(state)
    again = resumed.take(4)
    # Open prompts first (in the order pulled, with their uids), then the dataloader goes on after them.
    assert [r.position for r in again] == [3, 4, 5, 6]
    assert [r.uid for r in again[:3]] == [first[3].uid, first[4].uid, "p5"] and again[3].uid == "p6"
    trained = {r.position for r in first[:3]}
    assert trained.isdisjoint(r.position for r in again)


def test_feed_regenerated_prompt_goes_out_before_the_queue():
    feed = _feed()
    refs = feed.take(2)
    feed.requeue(refs[0].uid)
    assert [r.position for r in feed.take(2)] == [0, 2]


ASYNC_SEPARATE = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate",
                  "actor_rollout_ref.rollout.async_training=true"]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["actor_rollout_ref.rollout.async_training=true"], "async_training=true needs engines of their own"),
        (["actor_rollout_ref.rollout.mode=later"], r"'actor_rollout_ref.rollout.mode' must be one of .*got 'later'"),
        ([*ASYNC_SEPARATE, "actor_rollout_ref.rollout.staleness=1"], "leave staleness at 0"),
        ([*ASYNC_SEPARATE, "actor_rollout_ref.rollout.max_staleness=-1"], r"'actor_rollout_ref.rollout.max_staleness' must be an int >= 0.*got -1"),
        ([*ASYNC_SEPARATE, "actor_rollout_ref.rollout.stale_groups=skip"], r"'actor_rollout_ref.rollout.stale_groups' must be one of .*got 'skip'"),
        ([*ASYNC_SEPARATE, "actor_rollout_ref.rollout.partial_rollout=keep"], r"'actor_rollout_ref.rollout.partial_rollout' must be one of .*got 'keep'"),
        ([*ASYNC_SEPARATE, "algorithm=remax"], "algorithm=remax"),
        (["trainer.gpus_per_process=2"], r"gpus_per_process=2 must be a number in \(0, 1\]"),
        (["actor_rollout_ref.rollout.gpus_per_engine=0.5"], "GPU share of a separate engine"),
    ],
)
def test_async_and_gpu_share_settings_are_checked(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides)


def test_an_engine_report_is_filed_per_group_as_views_of_its_batch():
    import numpy as np
    import torch

    from protocol import DataProto
    from trainer.async_rollout import groups_of

    together = DataProto.from_dict({"x": torch.arange(6)}, {"uid": np.array(list("aabbcc"), dtype=object)})
    groups = groups_of(together)
    assert [(uid, g.batch["x"].tolist()) for uid, g in groups] == [("a", [0, 1]), ("b", [2, 3]), ("c", [4, 5])]
    # each group's rows share the report's memory: filing copies nothing
    assert all(g.batch["x"].untyped_storage().data_ptr() == together.batch["x"].untyped_storage().data_ptr() for _, g in groups)
    # a group split apart in the report is still filed whole, in order of first appearance
    apart = DataProto.from_dict({"x": torch.arange(6)}, {"uid": np.array(list("abacbc"), dtype=object)})
    assert [(uid, g.batch["x"].tolist()) for uid, g in groups_of(apart)] == [("a", [0, 2]), ("b", [1, 4]), ("c", [3, 5])]
