"""Where a step's rollout comes from: generated at the start of the step (staleness 0), or one step ahead
while the actor trains (staleness 1, separate placement only).

Both go through the run's rollout source (trainer/rollout_source.py), which syncs the engines to the actor's
newest weights before it generates: the pipeline only says when. With staleness 1, step k takes the batch the
engines generated during step k-1, starts generating batch k+1 (after the sync to the weights of step k-1:
the engines are idle then, between two generations) and returns batch k; the actor then trains on batch k
while batch k+1 is sampled.
So batch k+1 comes from the weights of step k-1. The first step (and the first after a resume) has no
batch in flight and generates its own, on-policy.

Checkpoints hold the dataloader position *before* the batch in flight: a resumed run generates that batch
again, with the checkpoint's weights (the in-flight generation of the stopped run is dropped).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from protocol import DataProto
from protocol.meta_merge import ROLLOUT_WEIGHTS_VERSION, SEED_KEY
from trainer.rollout_source import RolloutSource
from trainer.timing import PhaseTimer
from workers.rollout_choices import STALENESS_VALUES


def sampling_seed(seed: int, step: int, draw: int) -> int:
    """The sampling seed of one generation batch: a function of the run's seed, the step and the batch's
    draw within the step (0: the step's own batch; 1, 2, ...: batches drawn on top, e.g. by DAPO)."""
    if draw == 0:
        return seed * 100_003 + step  # the seeds of runs that draw once per step, as they always were
    return int(np.random.SeedSequence([seed, step, draw]).generate_state(1)[0])


def prompts_for_step(batch: DataProto, step: int, n: int, seed: int, draw: int = 0) -> DataProto:
    """The generation input of a batch: a uid per prompt (`<step>-<draw>-<row>`: unique in the run), `n`
    copies of each, and the batch's sampling seed."""
    uids = np.array([f"{step}-{draw}-{i}" for i in range(len(batch))], dtype=object)
    prompts = batch.union(DataProto.from_dict(non_tensors={"uid": uids})).repeat(n, interleave=True)
    prompts.meta_info[SEED_KEY] = sampling_seed(seed, step, draw)  # reproducible sampling
    return prompts


class LookaheadBatches:
    """The dataloader with a one-batch lookahead. `state_dict()` is the position before any batch taken
    ahead, so a checkpoint resumes with the batch that was in flight."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._batches = iter(loader)
        self._ahead: tuple[DataProto, dict[str, Any]] | None = None

    def next(self) -> DataProto:
        if self._ahead is not None:
            batch, self._ahead = self._ahead[0], None
            return batch
        return next(self._batches)

    def peek(self) -> DataProto:
        if self._ahead is None:
            state = self.loader.state_dict()
            self._ahead = (next(self._batches), state)
        return self._ahead[0]

    def state_dict(self) -> dict[str, Any]:
        return self._ahead[1] if self._ahead is not None else self.loader.state_dict()


class RolloutPipeline:
    """`rollout(prompts, upcoming, timer)` per step; see the module docstring."""

    def __init__(self, source: RolloutSource, staleness: int) -> None:
        if staleness not in STALENESS_VALUES:
            raise ValueError(f"staleness={staleness!r}; valid: {list(STALENESS_VALUES)}")
        self.source, self.staleness = source, staleness

    # ---- the step loop's batch source and checkpoint state -----------------------------------------------
    def batches(self, loader: Any) -> LookaheadBatches:
        return LookaheadBatches(loader)

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any], path: Any) -> None:
        open_prompts = (state.get("async_rollout") or {}).get("open")
        if open_prompts:
            print(
                f"warning: {path} was saved by an asynchronous run (rollout.async_training=true) with "
                f"{len(open_prompts)} prompts in flight or waiting; this run (async_training=false) goes on after "
                "them without training on them",
                file=sys.stderr,
            )

    def close(self) -> None:
        return None

    def rollout(self, prompts: DataProto, upcoming: Callable[[], DataProto | None], timer: PhaseTimer) -> DataProto:
        """This step's rollout. `upcoming()` gives the next step's prompts (None on the last step); with
        staleness 1 their generation starts here."""
        if self.staleness == 0:
            return self.source.generate_sequences(prompts, timer)  # the weights of the last update
        if not self.source.generating:  # first step, or first after a resume
            self.source.start_generation(prompts, timer)
        rollout = self.source.finish_generation(timer)
        # Between steps: the weights of the update that just finished, then the next batch (on the last step
        # the sync alone, so every step's sync is made and checked as before).
        self.source.start_generation(upcoming(), timer)
        return rollout

    def metrics(self, rollout: DataProto) -> dict[str, float]:
        """Which weights generated `rollout` and how many updates behind the actor's they are."""
        generated_by = rollout.meta_info.get(ROLLOUT_WEIGHTS_VERSION)
        actor = self.source.weights_version()
        if generated_by is None or actor is None:
            return {}
        return {"rollout/weights_version": float(generated_by), "rollout/staleness": float(actor - generated_by)}
