"""The validation samples `trainer.log_val_generations` sends to the trackers: decoded input, output and score."""

from __future__ import annotations

from typing import Any

import numpy as np

from protocol import DataProto

PICK_SEED = 42  # the same samples at every validation, so their outputs can be compared over the run


def decoded_generations(tokenizer: Any, prompts: DataProto, out: DataProto, scores: np.ndarray) -> list[dict[str, Any]]:
    """One {input, output, score} per row of `out` (the responses to `prompts`, row for row); special tokens
    (padding, EOS) left out."""
    if tokenizer is None:
        raise ValueError("trainer.log_val_generations needs the tokenizer to decode the samples")
    prompt_ids, prompt_mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    responses = out.batch["responses"]
    response_mask = out.batch["attention_mask"][:, -responses.shape[1]:].bool()  # tool tokens included
    def decode(rows: Any, masks: Any) -> list[str]:
        return tokenizer.batch_decode([ids[keep].tolist() for ids, keep in zip(rows, masks)], skip_special_tokens=True)

    inputs, outputs = decode(prompt_ids, prompt_mask), decode(responses, response_mask)
    return [{"input": i, "output": o, "score": float(s)} for i, o, s in zip(inputs, outputs, scores)]


def pick_generations(samples: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """`count` of `samples`, chosen the same way at every validation (ordered by input, then a fixed shuffle:
    the same prompts each time, not only the first ones of the file)."""
    if count <= 0 or not samples:
        return []
    ordered = sorted(samples, key=lambda sample: sample["input"])
    order = np.random.RandomState(PICK_SEED).permutation(len(ordered))
    return [ordered[i] for i in order[:count]]
