"""Sampling responses with HF `generate` on an FSDP2 model, and shaping them into fixed-size tensors."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from workers.rollout.sampling import SamplingParams
from workers.rollout.shaping import assemble_rollout


@contextlib.contextmanager
def gathered_parameters(model: nn.Module) -> Iterator[None]:
    """Keep every FSDP unit unsharded for the whole generation: one all-gather per unit instead of one
    per generated token; resharded afterwards. The root is skipped: FSDP2 already keeps its parameters
    gathered after forward, and switching it to resharding would outlive this block."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)


@contextlib.contextmanager
def seeded_sampling(seed: int | None, rank: int, device: torch.device) -> Iterator[None]:
    """With a per-call seed, sample from a private RNG stream that depends only on (seed, rank), so a
    step's rollout is reproducible whatever ran before; the global RNG streams are left as they were."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], device_type=device.type):
        torch.manual_seed((int(seed) * 1_000_003 + rank) % (2**63))
        yield


def generate_responses(
    model: nn.Module, prompts: dict[str, torch.Tensor], params: SamplingParams, synced: bool,
    model_kwargs: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Generate one response per left-padded prompt; returns the rollout batch tensors. `model_kwargs`: extra
    inputs of the prompts' forward (a vision-language model's images, workers/vision/forward_inputs.py).

    `synced` must be True when several ranks share the FSDP model: a rank whose rows all ended keeps
    running forward passes until every rank has finished, or the others would wait in an all-gather.
    """
    input_ids, attention_mask = prompts["input_ids"], prompts["attention_mask"]
    prompt_length = input_ids.shape[1]
    with torch.no_grad(), gathered_parameters(model):
        # HF derives the position ids from the attention mask (cumsum), like the prompts' own.
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=params.generation_config(),
            synced_gpus=synced,
            **(model_kwargs or {}),
        )
    return assemble_rollout(prompts, output[:, prompt_length:], params)
