"""Prompt dataset for RL: verl-layout parquet -> chat-templated, left-padded prompt tensors (and, for a
vision-language model, each row's encoded images; trainer/data/images.py)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from trainer.data.images import VisionTokens, placeholder_count, row_image_bytes  # noqa: E402
from trainer.data_names import TRUNCATION_MODES
from trainer.preflight import REQUIRED_COLUMNS  # noqa: F401,E402 - the prompt column (`prompt_key`) is required too
from workers.vision.images import MULTI_MODAL_DATA  # noqa: E402 - per row {"image": [encoded bytes, ...]}


class RLDataset(Dataset):
    """Prompts tokenized once at load; items are padded on access.

    Each prompt is rendered with the tokenizer's chat template (add_generation_prompt)
    and left-padded to `max_prompt_length`, so all generations start at the same column.
    Prompts longer than that follow `truncation`: "error" raises, "left" keeps the last
    tokens (the generation prompt survives), "right" keeps the first, "filter" drops the
    row at load (counted in `num_filtered`; truncated rows in `num_truncated`). With
    `filter_overlong_prompts` (verl's data.filter_overlong_prompts) they are dropped whatever
    `truncation` says: verl filters first, so its truncation then never applies.

    With `vision` (a vision-language model) the `image_key` column's pictures replace the prompt's `<image>`
    placeholders by the model's vision tokens, and each item carries them as `multi_modal_data` (encoded
    bytes). A truncation that would cut vision tokens is an error.
    """

    def __init__(
        self,
        parquet_files: str | Path | Sequence[str | Path],
        tokenizer: Any,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        truncation: str = "error",
        image_key: str | None = None,
        vision: VisionTokens | None = None,
        filter_overlong_prompts: bool = False,
        return_raw_chat: bool = True,
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
        if max_prompt_length <= 0:
            raise ValueError(f"max_prompt_length must be positive, got {max_prompt_length}")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.prompt_key = prompt_key
        self.truncation = truncation
        self.filter_overlong_prompts = bool(filter_overlong_prompts)
        self.return_raw_chat = bool(return_raw_chat)  # verl's data.return_raw_chat: the messages as `raw_prompt`
        self.image_key = image_key
        self.vision = vision
        self.pad_token_id = _pad_token_id(tokenizer)
        self.num_filtered = 0
        self.num_truncated = 0
        self._rows: list[dict[str, Any]] = []
        self._input_ids: list[list[int]] = []
        files = [parquet_files] if isinstance(parquet_files, (str, Path)) else list(parquet_files)
        if not files:
            raise ValueError("RLDataset needs at least one parquet file")
        for file in files:
            self._load_file(Path(file))
        if not self._rows:
            why = "filter_overlong_prompts=true" if self.filter_overlong_prompts else "truncation='filter'"
            raise ValueError(
                f"all {self.num_filtered} prompts are longer than max_prompt_length={max_prompt_length} and were "
                f"filtered ({why}); nothing left to train on"
            )

    def _load_file(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"parquet file {path} does not exist")
        table = pq.read_table(path)
        if table.num_rows == 0:
            raise ValueError(f"parquet file {path} has no rows")
        present = table.column_names
        for column in (self.prompt_key, *REQUIRED_COLUMNS):
            if column not in present:
                raise KeyError(f"parquet file {path} has no column {column!r}; columns present: {present}")
        prompts = table.column(self.prompt_key).to_pylist()
        data_sources = table.column("data_source").to_pylist()
        reward_models = table.column("reward_model").to_pylist()
        extra_infos = table.column("extra_info").to_pylist() if "extra_info" in present else [None] * table.num_rows
        images = self._images(table, path)

        texts = [
            self._render(self._with_vision_tokens(messages, images, path, row), path, row)
            for row, messages in enumerate(prompts)
        ]
        token_ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]  # template already has specials
        for row, ids in enumerate(token_ids):
            ids = self._fit(list(ids), path, row, images[row] if images else None)
            if ids is None:
                self.num_filtered += 1
                continue
            extra_info = extra_infos[row] or {}
            index = extra_info.get("index")
            self._input_ids.append(ids)
            self._rows.append(
                {
                    "data_source": data_sources[row],
                    "reward_model": reward_models[row],
                    "extra_info": extra_info,
                    **({"raw_prompt": prompts[row]} if self.return_raw_chat else {}),
                    "index": index if index is not None else len(self._rows),
                    **({MULTI_MODAL_DATA: {"image": images[row]}} if images is not None else {}),
                }
            )

    def _images(self, table: Any, path: Path) -> list[list[bytes]] | None:
        """Each row's encoded images; None for a text-only model's file without the image column (a
        vision-language model's rows always carry the key, so files with and without images mix)."""
        if not self.image_key or self.image_key not in table.column_names:
            return None if self.vision is None else [[] for _ in range(table.num_rows)]
        if self.vision is None:
            raise ValueError(
                f"{path} has an image column {self.image_key!r} but the model is text-only (set data.image_key=null)"
            )
        return [row_image_bytes(cells) for cells in table.column(self.image_key).to_pylist()]

    def _with_vision_tokens(self, messages: Any, images: list[list[bytes]] | None, path: Path, row: int) -> Any:
        if images is None:
            return messages
        placeholders = placeholder_count(messages)
        if placeholders != len(images[row]):
            raise ValueError(
                f"{path} row {row}: the prompt has {placeholders} <image> placeholders for {len(images[row])} images"
            )
        return self.vision.expand(messages, [self.vision.tokens_of(encoded) for encoded in images[row]])

    def _render(self, messages: Any, path: Path, row: int) -> str:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in messages
        ):
            raise TypeError(
                f"{path} row {row}: column {self.prompt_key!r} must hold a list of "
                f"{{'role', 'content'}} messages, got {messages!r}"
            )
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _fit(self, ids: list[int], path: Path, row: int, images: list[bytes] | None = None) -> list[int] | None:
        """Apply the truncation mode; None means the row is filtered out. Vision tokens are never cut."""
        limit = self.max_prompt_length
        if len(ids) <= limit:
            return ids
        if self.filter_overlong_prompts or self.truncation == "filter":
            return None
        if self.truncation == "error":
            raise ValueError(
                f"{path} row {row}: prompt is {len(ids)} tokens, longer than max_prompt_length={limit} "
                "(set data.truncation to 'left', 'right' or 'filter', drop such prompts with "
                "data.filter_overlong_prompts=true, or raise data.max_prompt_length)"
            )
        kept = ids[-limit:] if self.truncation == "left" else ids[:limit]
        if images and kept.count(self.vision.placeholder_id) != ids.count(self.vision.placeholder_id):
            raise ValueError(
                f"{path} row {row}: prompt is {len(ids)} tokens with images; truncation={self.truncation!r} to "
                f"max_prompt_length={limit} would cut its vision tokens (raise data.max_prompt_length or use 'filter')"
            )
        self.num_truncated += 1
        return kept

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids = self._input_ids[index]
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.full((self.max_prompt_length,), self.pad_token_id, dtype=torch.long)
        input_ids[pad:] = torch.tensor(ids, dtype=torch.long)
        attention_mask = torch.zeros(self.max_prompt_length, dtype=torch.long)
        attention_mask[pad:] = 1
        # Real tokens count 0, 1, 2, ... from the first non-pad token; pads sit at 0.
        position_ids = (attention_mask.cumsum(0) - 1).clamp(min=0)
        item: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        # Copies, so a consumer editing a message or dict can not change the dataset.
        item.update(copy.deepcopy(self._rows[index]))
        return item


def _pad_token_id(tokenizer: Any) -> int:
    """The pad id, falling back to eos like most causal-LM setups (pads are masked anyway)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    raise ValueError("tokenizer has neither a pad token nor an eos token to pad prompts with")
