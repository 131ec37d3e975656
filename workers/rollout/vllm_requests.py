"""vLLM requests of the rollout: sampling parameters from the rollout's settings, token prompts added to the
engine under fresh ids, and what a finished request sampled (with the engine's log-probs)."""

from __future__ import annotations

import itertools
import random
from typing import Any

_REQUEST_IDS = itertools.count()  # vLLM refuses an id it still serves: every (re)submission gets a new one


def draw_seed() -> int:
    """A fresh call seed, for unseeded sampling that several engine shards must still do alike."""
    return random.SystemRandom().randrange(2**31 - 1)


def row_seed(call_seed: int, rank: int, row: int) -> int:
    """Each response's own sampling seed: depends only on (call seed, rank, row)."""
    return (call_seed * 1_000_003 + rank * 65_537 + row) % (2**31 - 1)


def vllm_sampling(params: Any, max_tokens: int, seed: int | None, min_tokens: int = 0) -> Any:
    """vLLM's SamplingParams for one request from the rollout's sampling settings (greedy when not sampling),
    with the engine's log-prob of each sampled token. `min_tokens` keeps EOS out until that many tokens
    (a forced response length)."""
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=params.temperature if params.do_sample else 0.0,
        top_p=params.top_p if params.do_sample else 1.0,
        top_k=params.top_k if params.do_sample else 0,
        # ignore_eos: vLLM skips its own EOS check, and no stop token may end the response early either.
        stop_token_ids=[] if params.ignore_eos else list(params.eos_token_ids),
        ignore_eos=params.ignore_eos,
        logprobs=0,
        detokenize=False,
        seed=seed,
        # vLLM's strongest bias (it clamps to +-100): a probability of about e^-100, never drawn.
        logit_bias={token: -100.0 for token in params.suppress_token_ids} or None,
    )


def add_token_request(
    engine: Any, prefix: str, tokens: list[int], sampling: Any, lora_request: Any, final_only: bool
) -> str:
    """Add a token-id prompt to vLLM's `LLMEngine` under a fresh request id (returned). `final_only`: one output
    at the request's end; else each engine step hands back only its new tokens."""
    from vllm import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sampling.output_kind = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA
    request_id = f"{prefix}-{next(_REQUEST_IDS)}"
    engine.add_request(request_id, TokensPrompt(prompt_token_ids=tokens), sampling, lora_request=lora_request)
    return request_id


def sampled_tokens(output: Any) -> tuple[list[int], list[float]]:
    """A finished request's sampled tokens and the engine's log-prob of each (its first completion)."""
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    return tokens, [float(step[t].logprob) for step, t in zip(completion.logprobs or [], tokens)]
