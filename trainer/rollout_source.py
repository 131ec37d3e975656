"""The rollout source: the one owner of "bring the engines up to the actor's weights, then generate".

Every caller generates through it: the step loop (`StepLoop.step_rollout` over trainer/rollout_pipeline.py,
staleness 0 and 1), the asynchronous stream (trainer/async_rollout.py), validation, DAPO's extra draws,
ReMax's baseline and every recipe. `sync_weights` is the only place the weights move, and `generate_sequences`
and `start_generation` call it before they generate, so no loop syncs by hand and a step's engines never
generate with weights older than the loop means them to. A sync finds nothing to send when the actor's weights
have not changed since the last one, so the step's later generations (draws, the baseline, validation) cost
a version check, not a transfer: one sync per step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from protocol import DataProto, DataProtoFuture
from trainer.timing import PhaseTimer
from trainer.worker_metrics import mean_over_workers

if TYPE_CHECKING:
    from workers.rollout.separate_sync import IpcRolloutSync, SeparateWeightSync

ExecRecords = list[list[tuple[str, float]]]  # per rank, `(method, seconds inside it)` (trainer/overhead.py)


@dataclass
class RolloutSource:
    """Generation on the actor's own engine (`engines` None: HF, or vLLM in the actor's process) or on the
    separate engines' group, whose weights `weight_sync` brings over. `RoleGroups.build` makes the run's;
    `RolloutSource(actor_group)` serves a group of the stock actor worker. A caller that times the whole
    call itself (validation, ReMax's baseline) passes no timer."""

    actor: Any  # the actor/rollout/ref worker group
    engines: Any = None  # the separate engines' worker group (rollout.placement=separate)
    weight_sync: SeparateWeightSync | IpcRolloutSync | None = None
    sync_metrics: dict[str, float] = field(default_factory=dict)  # weight-sync results not yet reported
    # A generation started with `start_generation` and not fetched yet; while it runs the engines are not
    # called for their logs (those calls would wait behind the generation), which are taken just before.
    generation: DataProtoFuture | None = None
    parked_exec: ExecRecords = field(default_factory=list)
    parked_metrics: dict[str, float] = field(default_factory=dict)
    # rollout.async_training=true: the engines generate in the background; a weight sync pauses them around it.
    streaming: bool = False

    # ---- the one sync --------------------------------------------------------------------------------------
    def sync_weights(self, timer: PhaseTimer | None = None) -> dict[str, float]:
        """Bring the engines up to the actor's current weights (the `sync_weights` phase); nothing to send
        when they already are, and for the HF engine, which generates with the actor's own model."""
        with (timer or PhaseTimer())("sync_weights"):
            if self.weight_sync is not None:
                # Streaming engines are paused only where a sync needs it (see the sync's `engines_idle`): not
                # for a sync that finds nothing to send, nor around a broadcast, whose receive pauses each engine.
                metrics = self.weight_sync.sync(self._engines_paused if self.streaming else nullcontext)
            else:
                metrics = mean_over_workers(self.actor.sync_rollout_weights())
        self.sync_metrics.update(metrics)
        return metrics

    @contextmanager
    def _engines_paused(self) -> Iterator[None]:
        """The streaming engines parked between two engine steps; after, their in-flight responses go on
        with the new weights (or restart)."""
        self.engines.pause_generation()
        try:
            yield
        finally:
            self.engines.resume_generation()

    # ---- generation, each after the sync ----------------------------------------------------------------------
    def generate_sequences(self, prompts: DataProto, timer: PhaseTimer | None = None) -> DataProto:
        """The responses to `prompts`, generated now with the actor's current weights (phases `sync_weights`
        and `generate`)."""
        timer = timer or PhaseTimer()
        self.sync_weights(timer)
        with timer("generate"):
            return (self.engines or self.actor).generate_sequences(prompts)

    def start_generation(self, prompts: DataProto | None, timer: PhaseTimer | None = None) -> None:
        """Sync, then start generating `prompts` on the separate engines (phase `start_generate`);
        `finish_generation` returns the batch and the actor is free meanwhile (rollout.staleness=1).
        `prompts` None (the last step): the sync alone, so every step's sync is made and checked."""
        if self.engines is None:
            raise RuntimeError(
                "start_generation needs rollout.name=vllm with rollout.placement=separate (engines of their own)"
            )
        if self.generation is not None:
            raise RuntimeError("a generation is already in flight; call finish_generation() first")
        timer = timer or PhaseTimer()
        self.sync_weights(timer)
        if prompts is None:
            return
        with timer("start_generate"):
            self._park_engine_logs()
            self.generation = self.engines.generate_sequences_async(prompts)

    def finish_generation(self, timer: PhaseTimer | None = None) -> DataProto:
        """The batch of the generation started last (phase `wait_rollout`: how long it still took)."""
        if self.generation is None:
            raise RuntimeError("no generation in flight; call start_generation(prompts) first")
        future, self.generation = self.generation, None
        with (timer or PhaseTimer())("wait_rollout"):
            return future.get()

    @property
    def generating(self) -> bool:
        """Whether a batch started with `start_generation` is in flight."""
        return self.generation is not None

    def weights_version(self) -> int | None:
        """The actor's weights version at the last sync (separate engines only)."""
        return self.weight_sync.actor_version if self.weight_sync is not None else None

    # ---- the asynchronous stream (rollout.async_training=true); its step syncs with `sync_weights` -----------
    @property
    def num_engines(self) -> int:
        return self.engines.world_size

    def stream_exchange(self, per_engine: list[DataProto | None], waits: list[float]) -> list[dict[str, Any]]:
        """Hand each engine its new prompts (None: none) and collect its finished groups, one call each."""
        self._mark_streaming(per_engine)
        return self.engines.stream_exchange(per_engine, waits)

    def stream_submit(self, per_engine: list[DataProto | None]) -> None:
        """Hand each engine its new prompts (None: none) without collecting."""
        self._mark_streaming(per_engine)
        self.engines.stream_submit(per_engine)

    def _mark_streaming(self, per_engine: list[DataProto | None]) -> None:
        # From the first prompt handed out the engines may be generating at any time: syncs pause them.
        self.streaming = self.streaming or any(part is not None for part in per_engine)

    def stop_stream(self) -> None:
        """Stop the engines' background generation (what is in flight is dropped)."""
        if self.streaming:
            self.engines.stop_stream()
            self.streaming = False

    # ---- the step's logs ---------------------------------------------------------------------------------------
    def pop_metrics(self) -> dict[str, float]:
        """The sync's and the separate engines' metrics since the last call."""
        metrics, self.sync_metrics = self.sync_metrics, {}
        if self._engines_idle():
            metrics.update(mean_over_workers(self.engines.pop_step_metrics()))
        metrics.update(self.parked_metrics)
        self.parked_metrics = {}
        return metrics

    def pop_exec_seconds(self) -> dict[str, ExecRecords]:
        """The separate engines' `(method, seconds inside it)` per rank since the last pop (none without them)."""
        if self.engines is None:
            return {}
        if self._engines_idle():
            self._park_engine_exec()
        records = self.parked_exec or [[] for _ in range(self.engines.world_size)]
        self.parked_exec = []
        return {self.engines.name: records}

    def _park_engine_logs(self) -> None:
        """Take the engines' metrics and call records now, while they are idle."""
        self.parked_metrics.update(mean_over_workers(self.engines.pop_step_metrics()))
        self._park_engine_exec()

    def _park_engine_exec(self) -> None:
        if not self.parked_exec:
            self.parked_exec = [[] for _ in range(self.engines.world_size)]
        for parked, new in zip(self.parked_exec, self.engines.execute_all("sc_pop_exec_seconds")):
            parked.extend(new)

    def _engines_idle(self) -> bool:
        return self.engines is not None and self.generation is None
