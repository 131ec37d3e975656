"""Image prompts on the driver and the workers' image processing: `<image>` becomes as many vision tokens as the
processor makes of the picture, the batch carries the encoded bytes, and a worker processes each picture once."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from protocol import DataProto
from tests.vision.images import BLUE, RED, image_batch, png
from trainer.data import RLDataset, collate_to_dataproto
from trainer.data.images import VisionTokens
from workers.vision.images import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS, ImageInputs
from workers.vision.models import collapse_image_placeholders, vision_token_ids


def dataset(model_dir: str, files: str, max_prompt_length: int = 64, truncation: str = "error") -> RLDataset:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return RLDataset(files, tokenizer, max_prompt_length, truncation=truncation, image_key="images",
                     vision=VisionTokens.from_model(model_dir, tokenizer))


@pytest.mark.parametrize("size", [(56, 56), (100, 70), (30, 200)])
def test_vision_token_count_is_the_processors(tiny_vlm_dir, size):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buffer, format="JPEG")
    picture = buffer.getvalue()
    vision = VisionTokens.from_model(tiny_vlm_dir, AutoTokenizer.from_pretrained(tiny_vlm_dir))
    grid = ImageInputs(tiny_vlm_dir).row_inputs([picture])["image_grid_thw"]
    assert vision.tokens_of(picture) == int(grid.prod()) // 4 > 0


def test_the_dataset_writes_vision_tokens_and_carries_the_encoded_images(tiny_vlm_dir, visual_data):
    config = AutoConfig.from_pretrained(tiny_vlm_dir)
    data = dataset(tiny_vlm_dir, visual_data[0])
    pictures = pq.read_table(visual_data[0]).column("images").to_pylist()
    for index in (0, 7):
        item = data[index]
        ids = item["input_ids"][item["attention_mask"].bool()].tolist()
        start = ids.index(config.vision_start_token_id)
        assert ids[start + 1 : start + 6] == [config.image_token_id] * 4 + [config.vision_end_token_id]
        assert ids.count(config.image_token_id) == 4
        assert item[MULTI_MODAL_DATA] == {"image": [pictures[index][0]["bytes"]]}
    batch = collate_to_dataproto([data[i] for i in range(3)])
    assert batch.non_tensor_batch[MULTI_MODAL_DATA].shape == (3,)


def _write(path, prompt: str, pictures: list[bytes]) -> str:
    row = {"data_source": "synthetic/visual_colors", "prompt": [{"role": "user", "content": prompt}],
           "reward_model": {"ground_truth": "digits:8"}, "images": [{"bytes": p, "path": None} for p in pictures]}
    pq.write_table(pa.Table.from_pylist([row]), path)
    return str(path)


def test_the_dataset_refuses_a_placeholder_count_that_differs(tiny_vlm_dir, tmp_path):
    file = _write(tmp_path / "bad.parquet", "<image> and <image>?", [png(RED)])
    with pytest.raises(ValueError, match="row 0: the prompt has 2 <image> placeholders for 1 images"):
        dataset(tiny_vlm_dir, file)


def test_truncation_never_cuts_vision_tokens(tiny_vlm_dir, tmp_path):
    file = _write(tmp_path / "long.parquet", "x" * 40 + "<image>", [png(RED)])  # 65 tokens, the picture near the end
    with pytest.raises(ValueError, match="row 0: prompt is 65 tokens with images; truncation='right' .* would cut its vision tokens"):
        dataset(tiny_vlm_dir, file, max_prompt_length=40, truncation="right")
    kept = dataset(tiny_vlm_dir, file, max_prompt_length=40, truncation="left")  # the text's start goes, the picture stays
    assert kept.num_truncated == 1
    assert kept[0]["input_ids"].tolist().count(AutoConfig.from_pretrained(tiny_vlm_dir).image_token_id) == 4


def test_collapse_image_placeholders_keeps_one_per_image():
    pad = 9
    assert collapse_image_placeholders([1, 7, pad, pad, pad, 8, 2, 7, pad, pad, 8], pad) == [1, 7, pad, 8, 2, 7, pad, 8]
    assert collapse_image_placeholders([1, 2, 3], pad) == [1, 2, 3]


def test_a_worker_processes_each_picture_once_per_step(tiny_vlm_dir):
    texts = ["<image>colour?", "<image>colour?", "<image> or <image>?"]
    batch = image_batch(tiny_vlm_dir, texts, [[png(RED)], [png(BLUE)], [png(BLUE), png(RED)]])
    repeated = batch.repeat(4, interleave=True)  # rollout.n copies of each prompt, as the driver sends them
    images = ImageInputs(tiny_vlm_dir)
    first = images.attach(repeated)
    assert images.processed_count == 2  # two distinct pictures among 16 image slots
    rows = first.non_tensor_batch[MULTI_MODAL_INPUTS]
    assert [len(r["image_grid_thw"]) for r in rows[::4]] == [1, 1, 2]
    torch.testing.assert_close(rows[8]["pixel_values"][:16], rows[4]["pixel_values"])  # row 2's first image is blue
    images.attach(repeated[torch.tensor([5, 0, 11])])  # the next pass of the step, rows re-balanced
    assert images.processed_count == 2
    images.forget()
    images.attach(repeated)
    assert images.processed_count == 4
    assert MULTI_MODAL_INPUTS not in repeated.non_tensor_batch  # the input batch is left as it was


def test_vision_token_ids_of_the_tiny_vlm(tiny_vlm_dir):
    config = AutoConfig.from_pretrained(tiny_vlm_dir)
    assert set(vision_token_ids(config)) == {config.vision_start_token_id, config.vision_end_token_id,
                                             config.image_token_id, config.video_token_id}
