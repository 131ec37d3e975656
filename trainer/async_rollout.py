"""rollout.async_training=true: the separate vLLM engines generate all the time, the trainer takes each step's batch of
finished prompt groups as soon as it is ready.

Per step (`next()`, called by the step loop before `train_step`):
1. sync the engines to the actor's newest weights (the rollout source's sync, trainer/rollout_source.py, which
   also hands the prompts out): they pause between two engine steps, load them, and go on with the responses
   in flight (partial rollouts) or restart them (`rollout.partial_rollout`);
2. poll the engines, one call each that hands out new prompts while fewer than (max_staleness + 1) x
   train_batch_size are out (in progress, or finished and waiting: the bound of the stream) and collects the
   finished groups (all `rollout.n` responses of a prompt) into the buffer, and take `data.train_batch_size`
   groups when the staleness rules of `trainer/async_buffer.py` allow;
3. hand out replacements at once, up to max_staleness x train_batch_size out, so the engines keep
   generating while the actor trains. (With the new weights one more batch may go out: every prompt handed
   out at version v is among the first (v + max_staleness + 1) batches, so at most one batch is ever due at
   once and nothing has to be thrown away. max_staleness 0 is the synchronous loop.)

Every response carries the weights version of each token (`rollout_token_versions` [B, R]) and of its oldest
and newest (`rollout_version_min` / `rollout_version_max`); `rollout_log_probs` are per token from the weights
that sampled it, which is what the truncated importance sampling (`rollout.tis_imp_ratio_cap`) divides by.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from protocol import DataProto
from trainer.async_buffer import FinishedGroup, GroupBuffer
from trainer.prompt_feed import PromptFeed, PromptRef
from trainer.rollout_source import RolloutSource
from trainer.timing import PhaseTimer
from workers.rollout.stream.episodes import VERSION_MAX, VERSION_MIN

POLL_S = 0.05  # how long one collect call waits at most for a finished group


class AsyncRollout:
    def __init__(self, source: RolloutSource, cfg: DictConfig) -> None:
        rollout = cfg.actor_rollout_ref.rollout
        if source.engines is None:
            raise RuntimeError(
                "rollout.async_training=true needs the separate rollout engines (rollout.placement=separate)"
            )
        self.source, self.n = source, int(rollout.n)
        self.batch_size = int(cfg.data.train_batch_size)
        self.max_staleness = int(rollout.max_staleness)
        self.buffer = GroupBuffer(self.batch_size, int(rollout.max_staleness), rollout.stale_groups)
        self.feed: PromptFeed | None = None
        self.restored: dict[str, Any] | None = None  # the feed's state from a checkpoint, until fit() starts
        self.engine_of: dict[str, int] = {}  # uid -> the engine generating it
        self.in_progress: dict[str, int | None] = {}  # uid -> oldest token version, as the engines last said
        self.counts = {"dropped": 0, "regenerated": 0, "polls": 0, "stream_calls": 0}
        # Seconds of the polls' round trips into the engines, of those the engines spent in the method, and
        # the driver's own parts of the wait: choosing the prompts to hand out, filing the finished groups.
        parts = ("round_trip", "in_worker", "share_out", "filing", "thread_cpu", "process_cpu")
        self.exchange = dict.fromkeys(parts, 0.0)
        self.taken: DataProto | None = None
        self.phases: dict[str, float] = {}
        self.step_metrics: dict[str, float] = {}

    # ---- the step loop's batch source ------------------------------------------------------------------
    def batches(self, loader: Any) -> "AsyncRollout":
        self.feed = PromptFeed(loader)
        if self.restored is not None:
            self.feed.load_state_dict(self.restored)
        return self

    def next(self) -> DataProto:
        """The prompts of this step's batch (one row per group, with `uid`); `rollout()` gives the responses."""
        timer, started = PhaseTimer(), {**self.counts, **self.exchange}
        self.source.sync_weights(timer)  # the stream's one sync per step; the engines pause around it
        version = self.source.weights_version()
        # The driver's CPU time in the wait, its main thread's and the whole process's: a process figure far
        # above the wait's wall time means threads spinning beside it (see trainer.driver_threads).
        thread_cpu, process_cpu = time.thread_time(), time.process_time()
        with timer("wait_rollout"):
            groups = self._wait_for_batch(version)
        self.exchange["thread_cpu"] += time.thread_time() - thread_cpu
        self.exchange["process_cpu"] += time.process_time() - process_cpu
        for group in groups:
            self.feed.settle(group.uid)
        # Replacements start generating while the actor trains, with the weights before this update: at
        # most max_staleness batches may be out then, or more would be due at once than a step can take.
        self._hand_out(self.max_staleness * self.batch_size)
        self.taken = DataProto.concat([g.rows for g in groups])
        self.phases = timer.seconds
        self.step_metrics = self._metrics(self.taken, version, started)
        return prompts_of(self.taken, self.n)

    def state_dict(self) -> dict[str, Any]:
        """The dataloader position after every prompt pulled (the open ones are in `checkpoint_state`)."""
        return self.feed.loader.state_dict()

    def rollout(self, timer: PhaseTimer) -> DataProto:
        """The responses of the batch `next()` returned; its sync and wait times go to `timer`."""
        for phase, seconds in self.phases.items():
            timer.seconds[phase] = timer.seconds.get(phase, 0.0) + seconds
        return self.taken

    def metrics(self, rollout: DataProto) -> dict[str, float]:
        return self.step_metrics

    # ---- checkpoints ------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        return {"async_rollout": self.feed.state_dict()} if self.feed is not None else {}

    def restore(self, state: dict[str, Any], path: Any) -> None:
        """Resuming from the checkpoint at `path`: its open prompts go out first (none when it was saved by a
        synchronous run, whose dataloader position is all there is)."""
        self.restored = state.get("async_rollout")

    def close(self) -> None:
        """Stop the engines' streams (what they were generating belongs to no step)."""
        self.source.stop_stream()

    # ---- the stream ---------------------------------------------------------------------------------------
    def _wait_for_batch(self, version: int) -> list[FinishedGroup]:
        wait_s = 0.0
        while True:
            # One call per engine and poll: the prompts the bound lets out now ride on the collect (prompts
            # freed by groups expiring below go out with the next poll).
            share_started = time.perf_counter()
            per_engine = self._share_out((self.max_staleness + 1) * self.batch_size)
            self.exchange["share_out"] += time.perf_counter() - share_started
            self._poll(per_engine, wait_s)
            for group in self.buffer.expire(version):
                self._stale(group.uid)
            taken = self.buffer.take(version, self.in_progress)
            if taken is not None:
                return taken
            wait_s = POLL_S

    def _poll(self, per_engine: list[DataProto | None], wait_s: float) -> None:
        """Hand each engine its prompts and collect its finished groups, in one call per engine."""
        self.counts["polls"] += 1
        self.counts["stream_calls"] += 1
        self.in_progress = {}
        call_started = time.perf_counter()
        reports = self.source.stream_exchange(per_engine, [wait_s] * len(per_engine))
        self.exchange["round_trip"] += time.perf_counter() - call_started
        self.exchange["in_worker"] += max(report["worker_s"] for report in reports)
        filing_started = time.perf_counter()
        for rank, report in enumerate(reports):
            for uid in report["stale"]:
                self.engine_of.pop(uid, None)
                self._stale(uid)
            self.in_progress.update(report["in_progress"])
            rows = report["rollout"]
            if rows is None:
                continue
            for uid, group in groups_of(rows):
                oldest, newest = version_bounds(group)
                self.buffer.add(uid, group, oldest if oldest is not None else -1, newest)
                self.engine_of.pop(uid, None)
        self.exchange["filing"] += time.perf_counter() - filing_started

    def _stale(self, uid: str) -> None:
        """A group too old to train on: its prompt is generated again (regenerate; wait, as a fallback) or
        dropped (settled without training)."""
        if self.buffer.policy == "drop":
            self.feed.settle(uid)
            self.counts["dropped"] += 1
        else:
            self.feed.requeue(uid)
            self.counts["regenerated"] += 1

    def _hand_out(self, bound: int) -> None:
        """New prompts to the engines while fewer than `bound` are out, at once (a call of their own)."""
        per_engine = self._share_out(bound)
        if any(part is not None for part in per_engine):
            self.counts["stream_calls"] += 1
            self.source.stream_submit(per_engine)

    def _share_out(self, bound: int) -> list[DataProto | None]:
        """Each engine's new prompts (None: none), to the engines with the fewest groups, while fewer than
        `bound` are out (generating, or finished and not trained yet)."""
        free = bound - self.feed.outstanding()
        if free <= 0:
            return [None] * self.source.num_engines
        refs = self.feed.take(free)
        load = [0] * self.source.num_engines
        for rank in self.engine_of.values():
            load[rank] += 1
        share: list[list[PromptRef]] = [[] for _ in load]
        for ref in refs:
            rank = int(np.argmin(load))
            share[rank].append(ref)
            load[rank] += 1
            self.engine_of[ref.uid] = rank
        return [self.feed.rows(part).repeat(self.n, interleave=True) if part else None for part in share]

    def _metrics(self, rollout: DataProto, version: int, started: dict[str, float]) -> dict[str, float]:
        oldest, newest = rollout.batch[VERSION_MIN], rollout.batch[VERSION_MAX]
        sampled = oldest >= 0
        staleness = (version - oldest[sampled]).float()
        return {
            "rollout/weights_version": float(oldest[sampled].min()) if sampled.any() else float(version),
            "rollout/staleness": float(staleness.mean()) if sampled.any() else 0.0,
            "rollout/staleness_max": float(staleness.max()) if sampled.any() else 0.0,
            "rollout/multi_version_fraction": (
                float((newest[sampled] > oldest[sampled]).float().mean()) if sampled.any() else 0.0
            ),
            "async/dropped_groups": float(self.counts["dropped"] - started["dropped"]),
            "async/regenerated_groups": float(self.counts["regenerated"] - started["regenerated"]),
            "async/dropped_total": float(self.counts["dropped"]),
            "async/regenerated_total": float(self.counts["regenerated"]),
            # The driver's calls into the streams (hand-outs, collects) for this batch, and the polls among them.
            "async/stream_calls": float(self.counts["stream_calls"] - started["stream_calls"]),
            "async/polls": float(self.counts["polls"] - started["polls"]),
            # The polls' round trips and, of those, the time inside the engines' method (the slowest engine's):
            # a gap between the two is the call waiting for the engine's process, not the engine's work.
            "async/exchange_s": self.exchange["round_trip"] - started["round_trip"],
            "async/exchange_in_worker_s": self.exchange["in_worker"] - started["in_worker"],
            # The rest of the wait is the driver's: the prompts handed out, the finished groups filed.
            "async/share_out_s": self.exchange["share_out"] - started["share_out"],
            "async/filing_s": self.exchange["filing"] - started["filing"],
            "async/wait_thread_cpu_s": self.exchange["thread_cpu"] - started["thread_cpu"],
            "async/wait_process_cpu_s": self.exchange["process_cpu"] - started["process_cpu"],
            "async/buffered_groups": float(len(self.buffer)),
            "async/in_progress_groups": float(len(self.engine_of)),
        }


def groups_of(rows: DataProto) -> list[tuple[str, DataProto]]:
    """The rows of each prompt group (by `uid`), in order of first appearance: slices (views, no copy) of one
    batch ordered by group; the engines send each group's rows together, so that order is usually the batch's."""
    uids = rows.non_tensor_batch["uid"]
    starts = np.flatnonzero(np.r_[True, uids[1:] != uids[:-1]])
    if len(starts) != len(set(uids)):  # a group split apart: one reordering copy, stable within groups
        first_seen = {uid: i for i, uid in reversed(list(enumerate(uids)))}
        rows = rows[np.argsort([first_seen[uid] for uid in uids], kind="stable")]
        uids = rows.non_tensor_batch["uid"]
        starts = np.flatnonzero(np.r_[True, uids[1:] != uids[:-1]])
    stops = [*starts[1:], len(rows)]
    return [(str(uids[start]), rows[int(start):int(stop)]) for start, stop in zip(starts, stops)]


def version_bounds(rows: DataProto) -> tuple[int | None, int]:
    """A group's oldest token version (None when no row has a sampled token) and its newest."""
    oldest = rows.batch[VERSION_MIN]
    sampled = oldest[oldest >= 0]
    return (int(sampled.min()) if len(sampled) else None), int(rows.batch[VERSION_MAX].max())


def prompts_of(rollout: DataProto, n: int) -> DataProto:
    """One row per group (groups are `n` consecutive rows): the prompt tensors as the dataloader gives them,
    with every non-tensor field (`uid`, ground truth, ...)."""
    heads = rollout[np.arange(0, len(rollout), n)]
    width = heads.batch["prompts"].shape[1]
    tensors: dict[str, torch.Tensor] = {
        "input_ids": heads.batch["prompts"],
        "attention_mask": heads.batch["attention_mask"][:, :width],
        "position_ids": heads.batch["position_ids"][:, :width],
    }
    return DataProto.from_dict(tensors, dict(heads.non_tensor_batch))
