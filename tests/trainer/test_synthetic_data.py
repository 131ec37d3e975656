"""Synthetic parquet layout, determinism, and the random tiny model's char_class baseline."""

from __future__ import annotations

import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.datasets.synthetic import evaluate, main, make_rows, write_synthetic_dataset
from trainer.rewards import compute_score
from trainer.tiny_model import build_tiny_model


def test_columns_and_types(tmp_path) -> None:
    train, val = write_synthetic_dataset(tmp_path, train_size=40, val_size=8, tasks=["char_class", "arithmetic"])
    for path, split, size in ((train, "train", 40), (val, "val", 8)):
        table = pq.read_table(path)
        assert table.num_rows == size
        schema = table.schema
        assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert schema.field("data_source").type == pa.string() and schema.field("ability").type == pa.string()
        assert pa.types.is_list(schema.field("prompt").type)
        assert pa.types.is_struct(schema.field("reward_model").type)
        rows = table.to_pylist()
        assert {r["data_source"] for r in rows} == {"synthetic/char_class", "synthetic/arithmetic"}
        for index, row in enumerate(rows):
            assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"]
            assert row["reward_model"]["style"] == "rule" and isinstance(row["reward_model"]["ground_truth"], str)
            assert row["extra_info"] == {"split": split, "index": index}


def test_default_is_char_class_only_and_deterministic(tmp_path) -> None:
    main([str(tmp_path / "a"), "--train-size", "16", "--val-size", "4", "--seed", "5"])
    main([str(tmp_path / "b"), "--train-size", "16", "--val-size", "4", "--seed", "5"])
    a = pq.read_table(tmp_path / "a" / "train.parquet").to_pylist()
    assert a == pq.read_table(tmp_path / "b" / "train.parquet").to_pylist()
    assert {r["data_source"] for r in a} == {"synthetic/char_class"}
    assert {r["reward_model"]["ground_truth"] for r in a} == {"digits:8", "vowels:8"}
    assert a == make_rows(16, "train", 5)
    assert [r["prompt"] for r in a] != [r["prompt"] for r in make_rows(16, "val", 5)]  # splits draw different rows


def test_arithmetic_ground_truth_follows_precedence() -> None:
    assert evaluate([12, 7, 3], ["+", "*"]) == 33
    assert evaluate([2, 3, 4], ["*", "-"]) == 2
    assert evaluate([5, 9], ["-"]) == -4
    for row in make_rows(50, "train", 0, tasks=["arithmetic"]):
        content = row["prompt"][0]["content"]
        assert re.fullmatch(r"what is \d+( [-+*] \d+){1,2}\? end with #### and the answer\.", content), content
        assert re.fullmatch(r"-?\d+", row["reward_model"]["ground_truth"])


def test_unknown_task_or_class_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown tasks"):
        make_rows(4, "train", 0, tasks=["poetry"])
    with pytest.raises(ValueError, match="unknown char classes"):
        make_rows(4, "train", 0, char_classes=["emoji"])


def test_random_tiny_model_char_class_baseline_is_low(tmp_path) -> None:
    model_dir = build_tiny_model(tmp_path / "model", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows = make_rows(16, "val", 0)
    texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=True, top_k=0, top_p=1.0, num_return_sequences=4)
    responses = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = [
        compute_score(r["data_source"], text, r["reward_model"]["ground_truth"])
        for r, text in zip((r for r in rows for _ in range(4)), responses)
    ]
    baseline = sum(scores) / len(scores)
    assert baseline < 0.3, f"random model already scores {baseline:.3f}"  # measured ~0.09
