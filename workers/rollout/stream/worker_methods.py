"""The rollout worker's side of rollout.async_training=true: submit prompt groups, collect finished ones, pause the
stream around whatever needs the engine idle (weight loads, synchronous generates, sync checks)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from protocol import DataProto
from single_controller import Dispatch, register
from workers.rollout.sampling import sampling_params
from workers.rollout.stream.episodes import GroupFactory
from workers.rollout.stream.generation_stream import GenerationStream, StreamSettings
from workers.rollout.stream.jobs import SEED_MODULUS, ContinuousEngine

UID = "uid"


def group_seeds(uid: str, rows: int, run_seed: int) -> list[int]:
    """Each response's sampling seed, from its prompt's uid (the same in every process) and its row."""
    base = zlib.crc32(uid.encode()) * 1_000_003 + run_seed * 65_537
    return [(base + row) % SEED_MODULUS for row in range(rows)]


class StreamWorkerMixin:
    """Needs `self.engine` (a VLLMEngine), `self.agent`, `self.token_ids`, `self.config` and `self.weights_version`."""

    engine: Any
    agent: Any
    token_ids: tuple
    config: dict[str, Any]
    weights_version: int
    stream: GenerationStream | None = None

    def _stream(self) -> GenerationStream:
        if self.stream is None:
            rollout = self.config["rollout"]
            params = sampling_params(rollout, {}, *self.token_ids)
            settings = StreamSettings(
                int(rollout["max_staleness"]), rollout["stale_groups"], rollout["partial_rollout"]
            )
            engine = ContinuousEngine(self.engine, params, self.weights_version)
            self.stream = GenerationStream(engine, GroupFactory(params, self.agent), settings)
        return self.stream

    def _require_engine(self, method: str) -> Any:
        if self.engine is None:
            raise RuntimeError(f"{method}: call init_model() first")
        return self.engine

    @contextmanager
    def _engine_idle(self, method: str) -> Iterator[Any]:
        """The engine, free for a synchronous use (`method`, named in errors): the stream (if any) paused around it."""
        engine = self._require_engine(method)
        with self.stream.paused() if self.stream is not None else nullcontext():
            yield engine

    @register(Dispatch.ALL_TO_ALL)
    def stream_submit(self, prompts: DataProto | None) -> int:
        """Add prompt groups to the stream: rows sharing a `uid` (`rollout.n` each) form one group. Returns
        how many groups were added."""
        return self._submit(prompts)

    @register(Dispatch.ONE_TO_ALL)
    def stream_collect(self, wait_s: float = 0.0) -> dict[str, Any]:
        """Finished groups since the last call (`rollout`: their rows, or None), the uids dropped in flight
        as too stale (`stale`), and the oldest weights version of each group in progress (`in_progress`)."""
        return self._collect(wait_s)

    @register(Dispatch.ALL_TO_ALL)
    def stream_exchange(self, prompts: DataProto | None, wait_s: float) -> dict[str, Any]:
        """`stream_submit(prompts)` then `stream_collect(wait_s)` in one call: the driver's poll also hands
        out the prompts it has for this engine (one round trip into the busy engine process, not two).
        `worker_s`: the seconds spent inside this method (the driver compares it with the call's round trip)."""
        started = time.perf_counter()
        self._submit(prompts)
        report = self._collect(wait_s)
        return {**report, "worker_s": time.perf_counter() - started}

    def _submit(self, prompts: DataProto | None) -> int:
        if prompts is None or len(prompts) == 0:
            return 0
        stream = self._stream()
        uids = prompts.non_tensor_batch[UID]
        rows_of: dict[str, list[int]] = {}
        for row, uid in enumerate(uids):
            rows_of.setdefault(str(uid), []).append(row)
        groups = [
            stream.factory.group(uid, prompts[np.array(rows)], group_seeds(uid, len(rows), self.config["seed"]))
            for uid, rows in rows_of.items()
        ]
        stream.submit(groups)
        return len(groups)

    def _collect(self, wait_s: float) -> dict[str, Any]:
        if self.stream is None:
            return {"rollout": None, "stale": [], "in_progress": {}}
        return self.stream.collect(wait_s)

    @register(Dispatch.ONE_TO_ALL)
    def pause_generation(self) -> None:
        """Park the stream between two engine steps (a weight sync follows); `resume_generation` ends it."""
        self._stream().pause()

    @register(Dispatch.ONE_TO_ALL)
    def resume_generation(self) -> None:
        self._stream().resume()

    @register(Dispatch.ONE_TO_ALL)
    def stop_stream(self) -> None:
        """Drop every group in progress or not collected, and end the stream's thread."""
        if self.stream is not None:
            self.stream.stop()
            self.stream = None
