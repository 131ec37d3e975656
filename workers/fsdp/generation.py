"""Sampling responses with HF `generate` on an FSDP2 model, and shaping them into fixed-size tensors."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers import GenerationConfig


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    response_length: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int

    def generation_config(self) -> GenerationConfig:
        # A fresh config: nothing from the checkpoint's generation_config.json (top_k=50, repetition
        # penalties, ...) changes the distribution that the PPO log-probs assume.
        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return GenerationConfig(
            do_sample=self.do_sample,
            max_new_tokens=self.response_length,
            eos_token_id=list(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            num_beams=1,
            use_cache=True,
            **(sampling if self.do_sample else {}),
        )


def model_token_ids(model: nn.Module) -> tuple[tuple[int, ...], int | None]:
    """EOS ids and pad id from the model's generation config, else its config."""
    sources = [getattr(model, "generation_config", None), model.config]
    eos: Any = next((s.eos_token_id for s in sources if s is not None and s.eos_token_id is not None), None)
    pad = next((s.pad_token_id for s in sources if s is not None and getattr(s, "pad_token_id", None) is not None), None)
    if eos is None:
        raise ValueError("the model config names no eos_token_id; set rollout.eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    return eos_ids, pad


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


def response_mask_from_eos(responses: torch.Tensor, eos_token_ids: tuple[int, ...]) -> torch.Tensor:
    """1 up to and including the first EOS of each row, 0 after it (int64 [B, R])."""
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device)).long()
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos  # EOS tokens strictly before each position
    return (eos_before == 0).long()


def generate_responses(
    model: nn.Module, prompts: dict[str, torch.Tensor], params: SamplingParams, synced: bool
) -> dict[str, torch.Tensor]:
    """Generate one response per left-padded prompt; returns the rollout batch tensors.

    `synced` must be True when several ranks share the FSDP model: a rank whose rows all ended keeps
    running forward passes until every rank has finished, or the others would wait in an all-gather.
    """
    input_ids, attention_mask, position_ids = prompts["input_ids"], prompts["attention_mask"], prompts["position_ids"]
    batch, prompt_length = input_ids.shape
    length = params.response_length
    with torch.no_grad(), gathered_parameters(model):
        # HF derives the position ids from the attention mask (cumsum), like the prompts' own.
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=params.generation_config(),
            synced_gpus=synced,
        )
    generated = output[:, prompt_length:][:, :length]
    responses = torch.full((batch, length), params.pad_token_id, dtype=input_ids.dtype, device=input_ids.device)
    responses[:, : generated.shape[1]] = generated
    mask = response_mask_from_eos(responses, params.eos_token_ids)
    responses = torch.where(mask.bool(), responses, torch.full_like(responses, params.pad_token_id))
    offsets = torch.arange(1, length + 1, dtype=position_ids.dtype, device=position_ids.device)
    response_positions = position_ids[:, -1:] + offsets
    return {
        "prompts": input_ids,
        "responses": responses,
        "input_ids": torch.cat([input_ids, responses], dim=1),
        "attention_mask": torch.cat([attention_mask, mask.to(attention_mask.dtype)], dim=1),
        "position_ids": torch.cat([position_ids, response_positions], dim=1),
        "response_mask": mask,
    }
