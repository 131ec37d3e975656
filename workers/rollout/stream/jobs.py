"""Model turns on vLLM's engine, one engine step at a time, across weight updates.

Every turn is its own vLLM request streaming its new tokens at each step (`RequestOutputKind.DELTA`), so each
token is recorded with its log-prob and the weights version of the step that sampled it. For a weight update
the running turns are *parked* between two steps (aborted in the engine, their tokens kept) and *resumed*
after: either continued (partial rollout: a new request whose prompt is the context plus the tokens so far,
so the new weights recompute the keys/values of every earlier token and sample the rest) or restarted from
scratch (abort).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workers.rollout.sampling import SamplingParams
from workers.rollout.vllm_requests import add_token_request, sampled_tokens, vllm_sampling

SEED_MODULUS = 2**31 - 1


@dataclass(eq=False)
class TurnJob:
    """One model turn: `context` in, at most `max_tokens` tokens out (exactly `min_tokens` or more).
    `owner` is whatever the caller needs to route the finished turn (e.g. its episode)."""

    context: list[int]
    max_tokens: int
    seed: int | None
    owner: Any = None
    min_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the weights version that sampled each token
    restarts: int = 0  # submissions after the first (each samples from its own seed)
    # Routing replay: the experts of every token its last request ran, from the context's first token on
    # ([context + tokens - 1, layers, k]); vLLM hands them over with the finished output only.
    routed_experts: Any = None

    def extend(self, tokens: list[int], log_probs: list[float], version: int) -> None:
        self.tokens.extend(tokens)
        self.log_probs.extend(log_probs)
        self.versions.extend([version] * len(tokens))

    def restart(self) -> None:
        """Drop what this turn sampled so far (partial_rollout=abort)."""
        self.tokens, self.log_probs, self.versions = [], [], []

    def submission_seed(self) -> int | None:
        return None if self.seed is None else (self.seed + 7_919 * self.restarts) % SEED_MODULUS


class ContinuousEngine:
    """`add(job)`, then `step()` repeatedly; `park()` / `resume(restart)` around a weight update.
    Not thread-safe: one thread at a time (the caller holds the stream's engine turn)."""

    def __init__(self, vllm: Any, params: SamplingParams, version: int) -> None:
        """`vllm`: the worker's `VLLMEngine` (its LLM, and the LoRA adapter it serves, if any)."""
        self.vllm = vllm
        self.engine = vllm.llm.llm_engine
        self.params = params
        self.version = version  # the actor's weights version the engine holds
        self.running: dict[str, TurnJob] = {}
        self.parked: list[TurnJob] = []

    def add(self, job: TurnJob) -> None:
        remaining = job.max_tokens - len(job.tokens)
        sampling = vllm_sampling(
            self.params, remaining, job.submission_seed(), max(0, job.min_tokens - len(job.tokens))
        )
        # Each step hands back only its new tokens.
        request_id = add_token_request(
            self.engine, "stream", job.context + job.tokens, sampling, self.vllm.lora_request, final_only=False
        )
        self.running[request_id] = job

    def step(self) -> list[TurnJob]:
        """One engine step; the turns it finished (their last tokens included)."""
        finished = []
        for output in self.engine.step():
            job = self.running.get(output.request_id)
            if job is None:
                continue
            tokens, log_probs = sampled_tokens(output)
            job.extend(tokens, log_probs, self.version)
            if output.finished:
                del self.running[output.request_id]
                # A resumed turn's request ran its earlier tokens as prompt: its experts cover the whole turn.
                job.routed_experts = output.outputs[0].routed_experts if self.vllm.returns_routing else None
                finished.append(job)
        return finished

    def busy(self) -> bool:
        return bool(self.running)

    def park(self) -> None:
        """Take every running turn out of the engine, keeping the tokens it has (between two steps)."""
        if self.running:
            self.engine.abort_request(list(self.running))
            self.parked.extend(self.running.values())
            self.running.clear()

    def resume(self, restart: bool) -> None:
        """Submit the parked turns again: continued from their tokens, or (`restart`) from scratch."""
        parked, self.parked = self.parked, []
        # Turns that had started first (vLLM schedules in arrival order): a long response half done should
        # not queue behind prompts that never ran.
        parked.sort(key=lambda job: not job.tokens)
        for job in parked:
            job.restarts += 1
            if restart:
                job.restart()
            self.add(job)

    def forget(self, owners: Iterable[Any]) -> None:
        """Drop the turns (running or parked) of `owners` (e.g. groups too stale to train on)."""
        gone = set(map(id, owners))
        doomed = [request_id for request_id, job in self.running.items() if id(job.owner) in gone]
        if doomed:
            self.engine.abort_request(doomed)
            for request_id in doomed:
                del self.running[request_id]
        self.parked = [job for job in self.parked if id(job.owner) not in gone]

    def forget_all(self) -> None:
        self.park()
        self.parked = []
