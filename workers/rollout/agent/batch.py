"""Conversations -> the rollout batch every engine returns, with holes in `response_mask` for tool tokens.

`responses` [B, R] hold every token after the prompt (model and tool), padded after the last one;
`attention_mask` is 1 over all of them (tool text is context the model reads), `response_mask` only over
model tokens, and `rollout_log_probs` are the engine's log-probs on model tokens, 0 elsewhere. Per-sample
counts ride along as [B] tensors for the metrics (`agent_metrics`).
"""

from __future__ import annotations

import math

import torch

from workers.rollout.agent.loop import Conversation
from workers.rollout.shaping import rollout_tensors
from workers.routing_replay.rollout_tables import engine_table
from workers.routing_replay.token_order import ROUTED_EXPERTS


def conversation_batch(
    prompts: dict[str, torch.Tensor], conversations: list[Conversation], response_length: int, pad_token_id: int
) -> dict[str, torch.Tensor]:
    input_ids, attention_mask = prompts["input_ids"], prompts["attention_mask"]
    batch = len(conversations)
    responses = torch.full((batch, response_length), pad_token_id, dtype=input_ids.dtype)
    in_response = torch.zeros(batch, response_length, dtype=attention_mask.dtype)
    model_mask = torch.zeros(batch, response_length, dtype=torch.int64)
    log_probs = torch.zeros(batch, response_length, dtype=torch.float32)
    for i, conversation in enumerate(conversations):
        length = len(conversation.response)
        responses[i, :length] = torch.tensor(conversation.response, dtype=input_ids.dtype)
        in_response[i, :length] = 1
        model_mask[i, :length] = torch.tensor(conversation.mask, dtype=torch.int64)
        log_probs[i, :length] = torch.tensor(conversation.log_probs, dtype=torch.float32)
    counts = {
        "num_turns": [c.turns for c in conversations],
        "num_tool_calls": [c.tool_calls for c in conversations],
        "num_tool_errors": [c.tool_errors for c in conversations],
        "num_tool_timeouts": [c.tool_timeouts for c in conversations],
        "num_outputs_cut": [c.outputs_cut for c in conversations],
        "truncated": [int(c.truncated) for c in conversations],
        "hit_max_turns": [int(c.hit_max_turns) for c in conversations],
    }
    rewards = [c.env.reward(c.final_text) for c in conversations]
    routing = {}
    if any(c.routing is not None for c in conversations):  # routing replay: one table over prompt + response
        routing[ROUTED_EXPERTS] = engine_table([c.routing for c in conversations], attention_mask, response_length)
    return {
        **rollout_tensors(prompts, responses, in_response, model_mask),
        "rollout_log_probs": log_probs * model_mask,
        "env_reward": torch.tensor([math.nan if r is None else float(r) for r in rewards], dtype=torch.float32),
        **{key: torch.tensor(values, dtype=torch.int64) for key, values in counts.items()},
        **routing,
    }
