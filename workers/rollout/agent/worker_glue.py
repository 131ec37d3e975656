"""What a rollout worker needs to run the agent loop: build it from the config, and run it on HF or vLLM."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from protocol import DataProto
from workers.rollout.agent.engines import HFTurns, VLLMTurns
from workers.rollout.agent.rollout import AgentRollout, sample_fields
from workers.rollout.hf_generate import gathered_parameters, seeded_sampling
from workers.rollout.sampling import SamplingParams
from workers.routing_replay.hooks import RouterChoices

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


def build_agent(rollout_cfg: dict[str, Any], model_path: str, eos_token_ids: tuple[int, ...]) -> AgentRollout | None:
    """The worker's multi-turn rollout, or None when `rollout.multi_turn.enable` is off."""
    multi_turn = rollout_cfg["multi_turn"]
    if not multi_turn["enable"]:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return AgentRollout(multi_turn, tokenizer, rollout_cfg["response_length"], eos_token_ids)


def hf_agent_generate(
    agent: AgentRollout,
    model: nn.Module,
    prompts: DataProto,
    params: SamplingParams,
    device: torch.device,
    rank: int,
    synced: bool,
    routing: RouterChoices | None = None,
) -> dict[str, torch.Tensor]:
    """Turn-batched HF generate on the (FSDP) model; all ranks take part in every round. With `routing` the
    batch carries the experts each token was routed to (routing replay R3)."""
    seed = prompts.meta_info.get("seed")
    inputs = {k: prompts.batch[k].to(device) for k in PROMPT_KEYS}
    samples = sample_fields(prompts.non_tensor_batch, len(prompts))
    with torch.no_grad(), seeded_sampling(seed, rank, device), gathered_parameters(model):
        return agent.run(inputs, samples, HFTurns(model, params, device, synced, routing), params, seed, rank)


def vllm_agent_generate(
    agent: AgentRollout,
    llm: Any,
    prompts: DataProto,
    params: SamplingParams,
    rank: int,
    lora_request: Any = None,
    returns_routing: bool = False,
) -> dict[str, torch.Tensor]:
    """Continuous-batching turns on a vLLM `LLM`; `lora_request` names the synced LoRA adapter (None: none);
    `returns_routing`: the engine was started to return each request's experts (routing replay R3)."""
    seed = prompts.meta_info.get("seed")
    inputs = {k: prompts.batch[k] for k in PROMPT_KEYS}
    samples = sample_fields(prompts.non_tensor_batch, len(prompts))
    turns = VLLMTurns(llm, params, seed, rank, lora_request, returns_routing)
    return agent.run(inputs, samples, turns, params, seed, rank)
