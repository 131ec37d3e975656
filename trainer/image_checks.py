"""Driver-side checks of image data (`data.image_key`), run before Ray starts with the other row checks
(trainer/data_checks.py): the model reads images, every picture decodes, each row's prompt holds one `<image>`
per picture, and the run's settings support images. Each problem is one InputError naming the file and row.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from omegaconf import DictConfig

from trainer.data.images import IMAGE_PLACEHOLDER, placeholder_count, row_image_bytes
from trainer.input_errors import InputError
from trainer.package_checks import module_present

BATCH_ROWS = 1024  # rows read at a time: image columns are large


def files_with_images(files: Any, image_key: str | None) -> list[str]:
    """The parquet files (one path or a list) that have the image column."""
    if not image_key:
        return []
    listed = [files] if isinstance(files, (str, Path)) else list(files or [])
    return [str(f) for f in listed if image_key in pq.read_schema(f).names]


def _first_row_with_images(file: str, image_key: str) -> int | None:
    offset = 0
    for batch in pq.ParquetFile(file).iter_batches(batch_size=BATCH_ROWS, columns=[image_key]):
        for row, cells in enumerate(batch.column(0).to_pylist()):
            if cells:
                return offset + row
        offset += batch.num_rows
    return None


def _decode_problem(cells: Any) -> str | None:
    from PIL import Image

    try:
        encoded = row_image_bytes(cells)
    except (TypeError, OSError) as error:
        return f"an image cannot be read ({error})"
    for index, data in enumerate(encoded):
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.load()  # the whole picture, as the workers will decode it
        except Exception as error:  # noqa: BLE001 - PIL raises many kinds for a damaged file: each is the same problem
            return f"image {index} ({len(data)} bytes) does not decode ({type(error).__name__}: {error})"
    return None


def _row_problem(messages: Any, cells: Any) -> str | None:
    problem = _decode_problem(cells)
    if problem:
        return problem
    placeholders, images = placeholder_count(messages), len(cells or [])
    if placeholders != images:
        return (f"the prompt has {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) for {images} image(s); write one "
                f"{IMAGE_PLACEHOLDER} in the message text where each image goes")
    return None


def check_image_rows(file: str, key: str, prompt_key: str, image_key: str) -> None:
    """Every row's pictures decode and match its placeholders; raises InputError naming the first bad row."""
    offset = 0
    for batch in pq.ParquetFile(file).iter_batches(batch_size=BATCH_ROWS, columns=[prompt_key, image_key]):
        prompts, images = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        for row, (messages, cells) in enumerate(zip(prompts, images)):
            problem = _row_problem(messages, cells)
            if problem:
                raise InputError(f"{key}: {file} row {offset + row}: column {image_key!r}: {problem}")
        offset += batch.num_rows


def unsupported_with_images(cfg: DictConfig) -> list[str]:
    """Settings of `cfg` that image prompts do not run with (each with the reason)."""
    problems = []
    if cfg.actor_rollout_ref.actor.strategy != "fsdp":
        problems.append("actor_rollout_ref.actor.strategy=megatron (image inputs are built for the FSDP actor)")
    if cfg.algorithm.adv_estimator == "gae":
        problems.append(
            "algorithm.adv_estimator=gae needs a critic, which reads no images "
            "(use algorithm=grpo, rloo, reinforce_pp or remax)"
        )
    if cfg.reward_model.enable:
        problems.append("reward_model.enable=true (the reward model reads no images)")
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        problems.append("actor_rollout_ref.rollout.multi_turn.enable=true (multi-turn rollouts carry no images)")
    if cfg.actor_rollout_ref.rollout.get("async_training", False):
        problems.append("actor_rollout_ref.rollout.async_training=true (the streaming engines take no images)")
    if cfg.actor_rollout_ref.rollout.name == "vllm" and not module_present("torchvision"):
        problems.append(
            "actor_rollout_ref.rollout.name=vllm without torchvision (vLLM's Qwen2-VL imports transformers' "
            "torchvision image processor; install the torchvision build that matches your torch, or use "
            "actor_rollout_ref.rollout.name=hf)"
        )
    return problems


def check_images(cfg: DictConfig, data_keys: list[tuple[str, Any]]) -> None:
    """All image checks of the run's data files (`data_keys`: (config key, files) pairs)."""
    from workers.vision.models import folder_is_vision_language

    image_key = cfg.data.get("image_key")
    model = cfg.actor_rollout_ref.model.path
    vision_language = None
    for key, files in data_keys:
        for file in files_with_images(files, image_key):
            row = _first_row_with_images(file, image_key)
            if row is None:
                continue  # an empty image column: a text dataset
            if vision_language is None:
                vision_language = folder_is_vision_language(model)
            if not vision_language:
                raise InputError(
                    f"{key}: {file} row {row} has images (column {image_key!r}) but "
                    f"actor_rollout_ref.model.path={model!r} is a text-only model (its config.json has no "
                    "vision_config); use a vision-language model (Qwen2-VL family) or set data.image_key=null to "
                    "ignore the column"
                )
            problems = unsupported_with_images(cfg)
            if problems:
                raise InputError(
                    f"{key}: {file} has images (column {image_key!r}), which this run cannot use: {'; '.join(problems)}"
                )
            check_image_rows(file, key, cfg.data.prompt_key, image_key)
