"""The responses of one prompt group (`rollout.n` rows sharing a uid) as they are generated in the stream.

An episode is one response: a single model turn, or a multi-turn agent conversation whose tool calls run in
threads between its turns (a slow tool holds back only its own conversation). The group is finished when
every episode is; it then becomes the rows of the usual rollout batch plus, per token, the weights version
that sampled it (`rollout_token_versions` [n, R], NO_VERSION outside the model's tokens) and per row the
oldest and newest of those versions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from protocol import DataProto
from workers.rollout.agent.batch import conversation_batch
from workers.rollout.agent.loop import NO_VERSION, AgentLoop, Conversation, TurnOutput
from workers.rollout.agent.rollout import AgentRollout, sample_fields
from workers.rollout.sampling import SamplingParams, forced_lengths
from workers.rollout.shaping import pad_token_lists, rollout_output, sampled_rollout
from workers.rollout.stream.jobs import SEED_MODULUS, TurnJob
from workers.routing_replay.rollout_tables import engine_table
from workers.routing_replay.token_order import ROUTED_EXPERTS

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
# Batch keys of an asynchronous rollout.
TOKEN_VERSIONS, VERSION_MIN, VERSION_MAX = "rollout_token_versions", "rollout_version_min", "rollout_version_max"


class SingleTurnEpisode:
    def __init__(self, context: list[int], max_tokens: int, min_tokens: int, seed: int | None) -> None:
        self.job = TurnJob(context, max_tokens, seed, owner=self, min_tokens=min_tokens)
        self.done = False

    def start(self) -> list[TurnJob]:
        return [self.job]

    def after_turn(self, job: TurnJob) -> list[TurnJob]:
        self.done = True
        return []

    def poll_tools(self) -> list[TurnJob]:
        return []

    def waiting_for_tools(self) -> bool:
        return False

    def oldest_version(self) -> int | None:
        return self.job.versions[0] if self.job.versions else None


class AgentEpisode:
    """A conversation moved on by the stream: each model turn is a `TurnJob`; tool calls run in between."""

    def __init__(self, loop: AgentLoop, conversation: Conversation, seed: int | None) -> None:
        self.loop, self.conversation, self.seed = loop, conversation, seed
        self.running: TurnJob | None = None
        self.done = False

    def _next_job(self) -> list[TurnJob]:
        request = self.loop.next_request(self.conversation)
        seed = None if self.seed is None else (self.seed * 257 + request.turn) % SEED_MODULUS
        self.running = TurnJob(request.context, request.max_tokens, seed, owner=self)
        return [self.running]

    def start(self) -> list[TurnJob]:
        return self._next_job()

    def after_turn(self, job: TurnJob) -> list[TurnJob]:
        self.running = None
        self.loop.after_turn(self.conversation, TurnOutput(job.tokens, job.log_probs, job.versions, job.routed_experts))
        self.done = self.conversation.done
        return []  # the tool calls run now; `poll_tools` submits the next turn once they all returned

    def poll_tools(self) -> list[TurnJob]:
        if not self.conversation.pending or not all(f.done() for f in self.conversation.pending):
            return []
        ready = self.loop.ready_after_tools([self.conversation], None)
        self.done = self.conversation.done
        return self._next_job() if ready else []

    def waiting_for_tools(self) -> bool:
        return bool(self.conversation.pending)

    def oldest_version(self) -> int | None:
        # Versions only grow within an episode: the first model token's is the oldest.
        first = next((v for v in self.conversation.versions if v != NO_VERSION), None)
        if first is None and self.running is not None and self.running.versions:
            first = self.running.versions[0]
        return first


@dataclass(eq=False)
class PromptGroup:
    uid: str
    rows: DataProto  # the n prompt rows (tensors and non-tensor fields) as the driver sent them
    episodes: list[Any]

    def finished(self) -> bool:
        return all(e.done for e in self.episodes)

    def oldest_version(self) -> int | None:
        """The oldest weights version among the tokens sampled so far (None before the first)."""
        return min((v for v in (e.oldest_version() for e in self.episodes) if v is not None), default=None)


def version_rows(rows: list[list[int]], mask: torch.Tensor) -> torch.Tensor:
    """Per-token versions [B, R]: each row's list placed at its start, NO_VERSION where `mask` is 0."""
    out = pad_token_lists(rows, mask.shape[1], NO_VERSION)
    return torch.where(mask.bool(), out, torch.full_like(out, NO_VERSION))


def with_version_bounds(result: dict[str, torch.Tensor], versions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Adds the token versions and each row's oldest / newest (NO_VERSION for a row without model tokens)."""
    present = versions != NO_VERSION
    big = torch.iinfo(torch.int64).max
    oldest = torch.where(present, versions, torch.full_like(versions, big)).min(dim=1).values
    result[TOKEN_VERSIONS] = versions
    result[VERSION_MIN] = torch.where(present.any(dim=1), oldest, torch.full_like(oldest, NO_VERSION))
    result[VERSION_MAX] = versions.max(dim=1).values
    return result


class GroupFactory:
    """Builds the episodes of a group from its prompt rows, and its rollout rows once finished."""

    def __init__(self, params: SamplingParams, agent: AgentRollout | None) -> None:
        self.params, self.agent = params, agent

    def group(self, uid: str, rows: DataProto, seeds: list[int | None]) -> PromptGroup:
        ids, mask = rows.batch["input_ids"], rows.batch["attention_mask"].bool()
        contexts = [row[m].tolist() for row, m in zip(ids, mask)]
        if self.agent is None:
            forced = forced_lengths(rows.non_tensor_batch, len(rows), self.params.response_length)
            episodes: list[Any] = [
                SingleTurnEpisode(context, length or self.params.response_length, length or 0, seed)
                for context, length, seed in zip(contexts, forced, seeds)
            ]
        else:
            loop = AgentLoop(None, self.agent.parser, self.agent.bridge, self.agent.settings)
            samples = sample_fields(rows.non_tensor_batch, len(rows))
            episodes = []
            for row, (context, sample, seed) in enumerate(zip(contexts, samples, seeds)):
                env = self.agent.new_environment()
                env.reset(sample, seed=seed)
                episodes.append(AgentEpisode(loop, Conversation(row, context, env), seed))
        return PromptGroup(uid, rows, episodes)

    def batch(self, group: PromptGroup) -> DataProto:
        """The finished group's rollout rows (the batch keys of a synchronous generate, plus versions)."""
        prompts = {k: group.rows.batch[k].cpu() for k in PROMPT_KEYS}
        if self.agent is None:
            jobs = [e.job for e in group.episodes]
            result = sampled_rollout(prompts, [j.tokens for j in jobs], [j.log_probs for j in jobs], self.params)
            versions = [j.versions for j in jobs]
            if any(j.routed_experts is not None for j in jobs):  # routing replay R3: the engine's experts
                routed = [j.routed_experts for j in jobs]
                result[ROUTED_EXPERTS] = engine_table(routed, prompts["attention_mask"], self.params.response_length)
        else:
            conversations = [e.conversation for e in group.episodes]
            result = conversation_batch(prompts, conversations, self.params.response_length, self.params.pad_token_id)
            versions = [c.versions for c in conversations]
        with_version_bounds(result, version_rows(versions, result["response_mask"]))
        return rollout_output(group.rows, result)
