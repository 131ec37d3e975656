"""Bad image input fails before Ray starts with one `error:` line naming the file and the row (exit code 2): a
picture that does not decode, more `<image>` placeholders than pictures, an image column on a text-only model,
and images with a setting that reads none (vLLM without torchvision among them)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.reliability.conftest import error_lines, short_run
from trainer.main import main
from trainer.package_checks import module_present
from trainer.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def rows(visual_data) -> list[dict]:
    return pq.read_table(visual_data[0]).to_pylist()


def write_rows(rows: list[dict], path, like: str) -> str:
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(like)), path)
    return str(path)


def fails_before_ray(capsys, model: str, train: str, tmp_path, *overrides: str) -> str:
    assets = {"model": model, "train": train, "val": train}
    assert main(short_run(assets, tmp_path / "run", *overrides)) == 2
    (line,) = error_lines(capsys)
    return line


@pytest.mark.parametrize("damage", ["truncated", "not_an_image"])
def test_an_image_that_does_not_decode_names_its_row(no_ray, tiny_vlm_dir, visual_data, rows, tmp_path, capsys, damage):
    bad = [dict(r) for r in rows]
    picture = rows[3]["images"][0]["bytes"]
    broken = picture[: len(picture) // 2] if damage == "truncated" else b"plain text, no picture"
    bad[3]["images"] = [{"bytes": broken, "path": None}]
    train = write_rows(bad, tmp_path / "train.parquet", visual_data[0])
    line = fails_before_ray(capsys, tiny_vlm_dir, train, tmp_path)
    assert line.startswith(f"error: data.train_files: {train} row 3: column 'images': image 0 ({len(broken)} bytes) does not decode (")


def test_more_placeholders_than_images_names_its_row(no_ray, tiny_vlm_dir, visual_data, rows, tmp_path, capsys):
    bad = [dict(r) for r in rows]
    bad[5]["prompt"] = [{"role": "user", "content": "<image> and <image>: which colours?"}]
    train = write_rows(bad, tmp_path / "train.parquet", visual_data[0])
    line = fails_before_ray(capsys, tiny_vlm_dir, train, tmp_path)
    assert line == (
        f"error: data.train_files: {train} row 5: column 'images': the prompt has 2 <image> placeholder(s) for 1 "
        "image(s); write one <image> in the message text where each image goes"
    )


def test_an_image_column_on_a_text_only_model_names_its_row(no_ray, visual_data, tmp_path, capsys):
    text_model = str(build_tiny_model(tmp_path / "text_model"))
    line = fails_before_ray(capsys, text_model, visual_data[0], tmp_path)
    assert line == (
        f"error: data.train_files: {visual_data[0]} row 0 has images (column 'images') but "
        f"actor_rollout_ref.model.path={text_model!r} is a text-only model (its config.json has no vision_config); use a "
        "vision-language model (Qwen2-VL family) or set data.image_key=null to ignore the column"
    )


def test_images_with_a_critic_are_refused(no_ray, tiny_vlm_dir, visual_data, tmp_path, capsys):
    line = fails_before_ray(capsys, tiny_vlm_dir, visual_data[0], tmp_path, "algorithm=ppo")
    assert line.startswith(f"error: data.train_files: {visual_data[0]} has images (column 'images'), which this run cannot use: ")
    assert "algorithm.adv_estimator=gae needs a critic" in line


@pytest.mark.skipif(module_present("torchvision"), reason="torchvision is installed here")
def test_images_with_vllm_and_no_torchvision_are_refused(no_ray, tiny_vlm_dir, visual_data, tmp_path, capsys):
    line = fails_before_ray(capsys, tiny_vlm_dir, visual_data[0], tmp_path, "actor_rollout_ref.rollout.name=vllm")
    assert line.startswith(f"error: data.train_files: {visual_data[0]} has images (column 'images'), which this run cannot use: ")
    assert "actor_rollout_ref.rollout.name=vllm without torchvision" in line and "rollout.name=hf" in line
