"""Sampling settings of one generate call, shared by every rollout engine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import GenerationConfig

# meta_info keys a generate_sequences call may set to override the rollout config (e.g. greedy validation);
# meta_info["seed"] (optional) makes the call's sampling depend only on (seed, rank).
GENERATION_OVERRIDES = ("do_sample", "temperature", "top_p", "top_k")
# extra_info key of a data row: the vLLM engines generate exactly this many response tokens for it (EOS is
# held back until then). For workloads of a known length distribution (benchmarks/async_rl.py, tests).
FORCED_RESPONSE_LENGTH = "forced_response_length"


@dataclass(frozen=True)
class SamplingParams:
    do_sample: bool
    temperature: float
    top_p: float
    top_k: int  # 0: off
    response_length: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    # Keep sampling past EOS (an EOS token is then an ordinary token of the response): every response is
    # response_length tokens long and all of them count (verl's rollout.ignore_eos, vLLM's ignore_eos).
    ignore_eos: bool = False
    # Tokens never sampled: a vision-language model's image placeholders (workers/vision/models.py), which the
    # next forward would read as slots for image features.
    suppress_token_ids: tuple[int, ...] = ()

    def generation_config(self) -> GenerationConfig:
        # A fresh config: nothing from the checkpoint's generation_config.json (top_k=50, repetition
        # penalties, ...) changes the distribution that the PPO log-probs assume.
        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return GenerationConfig(
            do_sample=self.do_sample,
            max_new_tokens=self.response_length,
            # No stop token when ignoring EOS. An empty list, not None: generate() would fill None from the
            # model's own generation config. (min_new_tokens would instead forbid EOS, changing the
            # distribution the trainer's log-probs assume.)
            eos_token_id=[] if self.ignore_eos else list(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            num_beams=1,
            use_cache=True,
            suppress_tokens=list(self.suppress_token_ids) or None,
            **(sampling if self.do_sample else {}),
        )


def first_set(sources: Sequence[Any], name: str) -> Any:
    """The first of `sources` (configs, None allowed) whose attribute `name` is set, that value; else None."""
    return next((getattr(s, name) for s in sources if getattr(s, name, None) is not None), None)


def model_token_ids(generation_config: Any, config: Any) -> tuple[tuple[int, ...], int | None]:
    """EOS ids and pad id from a model's generation config (may be None), else its config."""
    sources = [generation_config, config]
    eos, pad = first_set(sources, "eos_token_id"), first_set(sources, "pad_token_id")
    if eos is None:
        raise ValueError("the model config names no eos_token_id; set rollout.eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    return eos_ids, pad



def sampling_params(
    rollout_cfg: Mapping[str, Any], meta_info: Mapping[str, Any], model_eos: tuple[int, ...], model_pad: int | None
) -> SamplingParams:
    """The rollout config with the call's overrides; EOS/pad from the config, else from the model."""
    rollout = {**rollout_cfg, **{k: meta_info[k] for k in GENERATION_OVERRIDES if k in meta_info}}
    eos = rollout["eos_token_id"]
    eos_ids = model_eos if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
    pad = rollout["pad_token_id"] if rollout["pad_token_id"] is not None else model_pad
    return SamplingParams(
        do_sample=bool(rollout["do_sample"]),
        temperature=float(rollout["temperature"]),
        top_p=float(rollout["top_p"]),
        top_k=max(int(rollout["top_k"]), 0),  # verl's -1 (vLLM's "off") is 0 here, HF generate's and vLLM's off
        response_length=int(rollout_cfg["response_length"]),
        eos_token_ids=eos_ids,
        pad_token_id=eos_ids[0] if pad is None else int(pad),
        ignore_eos=bool(rollout["ignore_eos"]),
    )


def forced_lengths(non_tensor_batch: Mapping[str, Any], rows: int, limit: int) -> list[int | None]:
    """Per row, the `extra_info[FORCED_RESPONSE_LENGTH]` (cut to `limit`, the response length), or None."""
    infos = non_tensor_batch.get("extra_info")
    if infos is None:
        return [None] * rows
    lengths = [info.get(FORCED_RESPONSE_LENGTH) if isinstance(info, Mapping) else None for info in infos]
    return [None if length is None else max(1, min(int(length), limit)) for length in lengths]


def folder_token_ids(model_path: str) -> tuple[tuple[int, ...], int | None]:
    """`model_token_ids` of an HF folder, read from its configs without loading the weights."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    try:
        generation = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json
        generation = None
    return model_token_ids(generation, config.get_text_config())
