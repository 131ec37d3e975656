"""Turn a batch of generated responses into token-level rule rewards."""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from protocol import DataProto
from workers.rl_math.masked import last_valid_positions

from .registry import compute_score as default_compute_score


class RuleRewardManager:
    """Decode responses, score them with `compute_score`, put each score on the last response token.

    `compute_score(data_source, solution_str, ground_truth, extra_info)` is the verl
    signature; None uses the built-in table (trainer.rewards.compute_score).
    `num_examine` prints that many decoded samples per data_source on every call.
    Returns ([B, R] float32 scores, {"<data_source>/mean": mean score of that source}).
    """

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.compute_score = compute_score or default_compute_score
        self.num_examine = num_examine

    def __call__(self, data: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
        responses, response_mask = self._response_tensors(data)
        data_sources = _required(data, "data_source")
        reward_models = _required(data, "reward_model")
        extra_infos = data.non_tensor_batch.get("extra_info")

        last = last_valid_positions(response_mask)
        # Decode everything up to the last valid token: pad after it is dropped, and
        # skip_special_tokens removes eos and other specials inside.
        texts = self.tokenizer.batch_decode(
            [row[: int(end) + 1].tolist() for row, end in zip(responses, last)], skip_special_tokens=True
        )

        token_level_scores = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        by_source: dict[str, list[float]] = defaultdict(list)
        for i, text in enumerate(texts):
            data_source = str(data_sources[i])
            ground_truth = _ground_truth(reward_models[i], i, data_source)
            extra_info = extra_infos[i] if extra_infos is not None else None
            score = self._score(i, data_source, text, ground_truth, extra_info)
            # A row with no valid token has nowhere to carry its score; it still counts in metrics.
            if last[i] >= 0:
                token_level_scores[i, last[i]] = score
            by_source[data_source].append(score)
            if len(by_source[data_source]) <= self.num_examine:
                print(
                    f"[reward] data_source={data_source} score={score:.3f} "
                    f"ground_truth={ground_truth!r} response={text!r}"
                )

        # Keys are unprefixed: the trainer logs them under "reward/" next to its own reward/mean.
        metrics = {f"{source}/mean": float(np.mean(scores)) for source, scores in by_source.items()}
        return token_level_scores, metrics

    @staticmethod
    def _response_tensors(data: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        keys = set(data.batch.keys())
        missing = [k for k in ("responses", "response_mask") if k not in keys]
        if missing:
            raise KeyError(f"RuleRewardManager needs batch keys {missing}; batch has {sorted(keys)}")
        responses, response_mask = data.batch["responses"], data.batch["response_mask"]
        if responses.dim() != 2 or responses.shape != response_mask.shape:
            raise ValueError(
                f"responses {list(responses.shape)} and response_mask {list(response_mask.shape)} must both be [B, R]"
            )
        return responses, response_mask

    def _score(self, index: int, data_source: str, text: str, ground_truth: Any, extra_info: Any) -> float:
        where = f"sample {index} (data_source={data_source!r})"
        try:
            score = self.compute_score(data_source, text, ground_truth, extra_info)
        except Exception as exc:
            raise RuntimeError(f"reward function failed on {where}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(score, numbers.Real):
            raise TypeError(
                f"reward function returned {score!r} ({type(score).__name__}) for {where}; expected a number"
            )
        if not math.isfinite(float(score)):
            raise ValueError(f"reward function returned {score!r} for {where}; expected a finite number")
        return float(score)


def _required(data: DataProto, key: str) -> np.ndarray:
    if key not in data.non_tensor_batch:
        raise KeyError(f"RuleRewardManager needs non_tensor_batch[{key!r}]; present: {sorted(data.non_tensor_batch)}")
    return data.non_tensor_batch[key]


def _ground_truth(reward_model: Any, index: int, data_source: str) -> Any:
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise ValueError(
            f"sample {index} (data_source={data_source!r}): reward_model must be a dict with 'ground_truth', "
            f"got {reward_model!r}"
        )
    return reward_model["ground_truth"]
