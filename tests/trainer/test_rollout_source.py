"""The rollout source owns "sync the engines to the actor's weights, then generate" for every caller: with
driver-only fakes (no Ray), each step of the pipeline (staleness 0 and 1) and of the async stream syncs once, in
the source, before its engines generate, and the step's phases and sync metrics are what the trainer logs."""

import pytest

from protocol import DataProto
from trainer.rollout_pipeline import RolloutPipeline
from trainer.rollout_source import RolloutSource
from trainer.timing import PhaseTimer


class FakeActor:
    """The actor's version moves with each update; with its own engine (HF) it generates and syncs itself."""

    def __init__(self, calls: list[str]) -> None:
        self.calls, self.version = calls, 0

    def sync_rollout_weights(self) -> list[dict[str, float]]:
        self.calls.append("actor.sync")
        return [{"rollout/sync_s": 1.0}, {"rollout/sync_s": 3.0}]

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append("actor.generate")
        return prompts


class Ready:
    def __init__(self, value: DataProto) -> None:
        self.value = value

    def get(self) -> DataProto:
        return self.value


class FakeEngines:
    name, world_size = "rollout", 1

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append("engines.generate")
        return prompts

    def generate_sequences_async(self, prompts: DataProto) -> Ready:
        self.calls.append(f"engines.start:{prompts.meta_info['step']}")
        return Ready(prompts)

    def pop_step_metrics(self) -> list[dict[str, float]]:
        return [{"rollout/engine_metric": 2.0}]

    def execute_all(self, method: str) -> list[list[tuple[str, float]]]:
        return [[("generate_sequences", 0.5)]]

    def pause_generation(self) -> None:
        self.calls.append("engines.pause")

    def resume_generation(self) -> None:
        self.calls.append("engines.resume")

    def stream_submit(self, per_engine: list) -> None:
        self.calls.append("engines.submit")


class FakeSync:
    """Sends only when the actor's version moved since the last sync, as the real syncs do."""

    def __init__(self, actor: FakeActor, calls: list[str]) -> None:
        self.actor, self.calls, self.actor_version, self.synced = actor, calls, None, None

    def sync(self, engines_idle) -> dict[str, float]:
        self.actor_version = self.actor.version
        if self.synced == self.actor.version:
            return {}
        with engines_idle():
            self.calls.append(f"sync:{self.actor.version}")
        self.synced = self.actor.version
        return {"rollout/sync_s": 0.25}


def _separate() -> tuple[RolloutSource, FakeActor, list[str]]:
    calls: list[str] = []
    actor = FakeActor(calls)
    return RolloutSource(actor, FakeEngines(calls), FakeSync(actor, calls)), actor, calls


def _prompts(step: int) -> DataProto:
    return DataProto.from_dict(non_tensors={"uid": [f"{step}-0"]}, meta_info={"step": step})


def test_staleness_0_syncs_once_per_step_before_it_generates():
    source, actor, calls = _separate()
    pipeline = RolloutPipeline(source, 0)
    for step in range(2):
        timer = PhaseTimer()
        pipeline.rollout(_prompts(step), lambda: None, timer)
        assert set(timer.seconds) == {"sync_weights", "generate"}
        actor.version += 1  # the step's update
    assert calls == ["sync:0", "engines.generate", "sync:1", "engines.generate"]


def test_staleness_1_syncs_between_steps_and_on_the_last_one():
    source, actor, calls = _separate()
    pipeline = RolloutPipeline(source, 1)
    steps, phases = 3, []
    for step in range(steps):
        timer = PhaseTimer()
        following = step + 1
        rollout = pipeline.rollout(_prompts(step), lambda: _prompts(following) if following < steps else None, timer)
        assert rollout.meta_info["step"] == step
        phases.append(set(timer.seconds))
        actor.version += 1
    # Step 0 generates its own batch, then (weights unchanged: nothing to send) starts batch 1; every later step
    # takes its batch, syncs to the update before, and starts the next; the last one syncs with nothing to start.
    assert calls == ["sync:0", "engines.start:0", "engines.start:1", "sync:1", "engines.start:2", "sync:2"]
    assert phases[0] == phases[1] == {"sync_weights", "start_generate", "wait_rollout"}
    assert phases[2] == {"sync_weights", "wait_rollout"}
    assert not source.generating


def test_the_sync_metrics_reach_the_step_and_the_engines_logs_are_kept_while_they_generate():
    source, actor, _ = _separate()
    source.start_generation(_prompts(0))  # the engines' logs are taken before they start
    assert source.pop_metrics() == {"rollout/sync_s": 0.25, "rollout/engine_metric": 2.0}
    assert source.pop_exec_seconds() == {"rollout": [[("generate_sequences", 0.5)]]}
    source.finish_generation()
    assert source.pop_metrics() == {"rollout/engine_metric": 2.0}  # idle again: asked directly


def test_the_actors_own_engine_generates_after_its_sync():
    calls: list[str] = []
    source = RolloutSource(FakeActor(calls))
    timer = PhaseTimer()
    source.generate_sequences(_prompts(0), timer)
    assert calls == ["actor.sync", "actor.generate"] and set(timer.seconds) == {"sync_weights", "generate"}
    assert source.pop_metrics() == {"rollout/sync_s": 2.0} and source.pop_exec_seconds() == {}
    assert source.weights_version() is None
    with pytest.raises(RuntimeError, match="engines of their own"):
        source.start_generation(_prompts(1))


def test_a_streaming_sync_pauses_the_engines_once_prompts_are_out():
    source, actor, calls = _separate()
    source.sync_weights()  # nothing handed out yet: the engines are idle
    source.stream_submit([None])
    actor.version += 1
    source.sync_weights()  # still nothing out
    source.stream_submit([_prompts(0)])
    actor.version += 1
    source.sync_weights()
    assert calls == ["sync:0", "engines.submit", "sync:1", "engines.submit", "engines.pause", "sync:2",
                     "engines.resume"]
    assert source.weights_version() == 2
