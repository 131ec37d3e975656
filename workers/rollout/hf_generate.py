"""Hugging Face `generate`, once for every HF rollout path: the trainer's rollout (FSDP or Megatron model),
the agent loop's turns, the strategy's in-process engine and the engine API's `hf` executor.

All of them sample with the same fresh `GenerationConfig` (`SamplingParams.generation_config`), so top-k,
top-p, stop ids and seeding mean the same thing whichever path generates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from workers.rollout.sampling import SamplingParams, first_set
from workers.rollout.shaping import assemble_rollout


@contextlib.contextmanager
def gathered_parameters(model: nn.Module) -> Iterator[None]:
    """Keep every FSDP unit unsharded for the whole generation: one all-gather per unit instead of one
    per generated token; resharded afterwards. The root is skipped: FSDP2 already keeps its parameters
    gathered after forward, and switching it to resharding would outlive this block. A model without FSDP
    units passes through unchanged."""
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


def generate_tokens(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    params: SamplingParams,
    synced: bool = False,
    model_kwargs: dict[str, torch.Tensor] | None = None,
    max_new_tokens: int | None = None,
    with_log_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One `generate` over left-padded prompts: the new tokens [B, N] (a row that stopped early is padded with
    `params.pad_token_id`) and, with `with_log_probs`, each token's log-prob under the distribution it was
    drawn from (after temperature / top-k / top-p) [B, N]. `max_new_tokens` overrides `params.response_length`.

    `synced` must be True when several ranks share an FSDP model: a rank whose rows all ended keeps running
    forward passes until every rank has finished, or the others would wait in an all-gather. Parameters are
    not gathered here: a caller that generates several times (the agent's turns) gathers once around all."""
    config = params.generation_config()
    if max_new_tokens is not None:
        config.max_new_tokens = max_new_tokens
    config.output_scores = config.return_dict_in_generate = with_log_probs
    with torch.no_grad():
        # HF derives the position ids from the attention mask (cumsum), like the prompts' own.
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            synced_gpus=synced,
            **(model_kwargs or {}),
        )
    if not with_log_probs:
        return out[:, input_ids.shape[1] :], None
    new = out.sequences[:, input_ids.shape[1] :]
    scores = torch.stack(out.scores, dim=1)[:, : new.shape[1]].float()
    return new, torch.log_softmax(scores, dim=-1).gather(-1, new[..., None]).squeeze(-1)


def generate_responses(
    model: nn.Module,
    prompts: dict[str, torch.Tensor],
    params: SamplingParams,
    synced: bool,
    model_kwargs: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Generate one response per left-padded prompt; returns the rollout batch tensors. `model_kwargs`: extra
    inputs of the prompts' forward (a vision-language model's images, workers/vision/forward_inputs.py)."""
    with gathered_parameters(model):
        generated, _ = generate_tokens(
            model, prompts["input_ids"], prompts["attention_mask"], params, synced, model_kwargs
        )
    return assemble_rollout(prompts, generated, params)


def left_padded(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> left-padded input_ids and attention_mask [B, longest prompt]."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_token_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def generate_token_lists(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    device: torch.device,
    synced: bool = False,
    limits: Sequence[int] | None = None,
) -> list[tuple[list[int], list[float]]]:
    """Per prompt, in one batch: the generated tokens up to and including the first of `params.eos_token_ids`
    and at most its limit (`limits[i]`, default `params.response_length`), with their log-probs."""
    ids, mask = left_padded(prompts, params.pad_token_id, device)
    limits = list(limits) if limits is not None else [params.response_length] * len(prompts)
    new, log_probs = generate_tokens(model, ids, mask, params, synced, max_new_tokens=max(limits), with_log_probs=True)
    assert log_probs is not None
    results = []
    for tokens, steps, limit in zip(new.tolist(), log_probs.tolist(), limits):
        end = min(next((i + 1 for i, t in enumerate(tokens) if t in params.eos_token_ids), len(tokens)), limit)
        results.append((tokens[:end], steps[:end]))
    return results


def request_sampling(model: nn.Module, sampling: Mapping[str, Any]) -> SamplingParams:
    """The engine API's sampling dict (vLLM's field names: temperature, top_k, top_p, max_tokens,
    stop_token_ids) on this model: temperature 0 is greedy, top_k <= 0 is off, and a response stops at a
    stop id or at the model's EOS, as on vLLM."""
    text_config = model.config.get_text_config()  # a vision-language model keeps its token ids there
    sources = (model.generation_config, text_config)
    eos = first_set(sources, "eos_token_id")
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    stop = tuple(sorted({int(t) for t in sampling.get("stop_token_ids") or ()} | set(eos_ids)))
    pad = first_set(sources, "pad_token_id")
    temperature = float(sampling.get("temperature", 1.0))
    return SamplingParams(
        do_sample=temperature > 0,
        temperature=temperature,
        top_p=float(sampling.get("top_p", 1.0)),
        top_k=max(int(sampling.get("top_k", 0)), 0),
        response_length=int(sampling.get("max_tokens", 16)),
        eos_token_ids=stop,
        pad_token_id=int(pad) if pad is not None else (stop[0] if stop else 0),
    )


def engine_generate(
    model: nn.Module, prompts: Sequence[Sequence[int]], sampling: Mapping[str, Any], device: torch.device, rank: int = 0
) -> list[dict[str, list]]:
    """The engine API's `generate` on an HF model: per prompt, `token_ids` and their `log_probs`, all prompts
    in one batch; `sampling["seed"]` seeds the call as `seeded_sampling` does the trainer's rollout."""
    if not prompts:
        return []
    with seeded_sampling(sampling.get("seed"), rank, device):
        results = generate_token_lists(model, prompts, request_sampling(model, sampling), device)
    return [{"token_ids": tokens, "log_probs": log_probs} for tokens, log_probs in results]
