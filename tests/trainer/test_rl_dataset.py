"""RLDataset padding/masks/truncation, DataProto collation, and resumable batching."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from protocol import DataProto
from trainer.data import ResumableBatchSampler, RLDataset, collate_to_dataproto, make_dataloader
from trainer.datasets.synthetic import write_synthetic_dataset
from trainer.tiny_model import build_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _write(path, contents: list[str], **extra_columns) -> str:
    rows = {
        "data_source": ["synthetic/char_class"] * len(contents),
        "prompt": [[{"role": "user", "content": c}] for c in contents],
        "reward_model": [{"style": "rule", "ground_truth": "digits:8"}] * len(contents),
        "extra_info": [{"split": "train", "index": 100 + i} for i in range(len(contents))],
    }
    rows.update(extra_columns)
    pq.write_table(pa.table(rows), path)
    return str(path)


def _template_length(tokenizer, content: str) -> int:
    messages = [{"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_left_padding_masks_and_positions(tokenizer, tmp_path) -> None:
    path = _write(tmp_path / "d.parquet", ["hi", "write 8 digits."])
    dataset = RLDataset(path, tokenizer, max_prompt_length=48)
    assert len(dataset) == 2 and dataset.num_filtered == 0
    item = dataset[0]
    n = _template_length(tokenizer, "hi")
    pad = 48 - n
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert item[key].shape == (48,) and item[key].dtype == torch.long
    assert item["input_ids"][:pad].eq(tokenizer.pad_token_id).all()
    assert item["input_ids"][pad] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert tokenizer.decode(item["input_ids"][pad:]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert item["attention_mask"].tolist() == [0] * pad + [1] * n
    assert item["position_ids"].tolist() == [0] * pad + list(range(n))
    assert item["raw_prompt"] == [{"role": "user", "content": "hi"}]
    assert item["data_source"] == "synthetic/char_class"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "digits:8"}
    assert item["extra_info"] == {"split": "train", "index": 100} and item["index"] == 100


def test_items_are_copies(tokenizer, tmp_path) -> None:
    dataset = RLDataset(_write(tmp_path / "d.parquet", ["hi"]), tokenizer, 48)
    dataset[0]["raw_prompt"][0]["content"] = "changed"
    dataset[0]["input_ids"][:] = 7
    assert dataset[0]["raw_prompt"][0]["content"] == "hi" and dataset[0]["input_ids"][0] == tokenizer.pad_token_id


def test_truncation_modes(tokenizer, tmp_path) -> None:
    short, long = "hi", "write 8 digits, please, right now."
    path = _write(tmp_path / "d.parquet", [short, long])
    n_long = _template_length(tokenizer, long)
    limit = n_long - 5
    with pytest.raises(ValueError, match=rf"row 1: prompt is {n_long} tokens, longer than max_prompt_length={limit}"):
        RLDataset(path, tokenizer, limit)
    left = RLDataset(path, tokenizer, limit, truncation="left")[1]
    assert tokenizer.decode(left["input_ids"]).endswith("<|im_start|>assistant\n")  # generation prompt kept
    assert left["attention_mask"].all()
    right = RLDataset(path, tokenizer, limit, truncation="right")[1]
    assert tokenizer.decode(right["input_ids"]).startswith("<|im_start|>user\nwrite")
    assert right["position_ids"].tolist() == list(range(limit))
    filtered = RLDataset(path, tokenizer, limit, truncation="filter")
    assert len(filtered) == 1 and filtered.num_filtered == 1 and filtered[0]["raw_prompt"][0]["content"] == short
    with pytest.raises(ValueError, match="all 2 prompts are longer"):
        RLDataset(path, tokenizer, 5, truncation="filter")
    with pytest.raises(ValueError, match="truncation must be one of"):
        RLDataset(path, tokenizer, limit, truncation="middle")


def test_file_errors(tokenizer, tmp_path) -> None:
    no_reward = tmp_path / "no_reward.parquet"
    pq.write_table(pa.table({"data_source": ["x"], "prompt": [[{"role": "user", "content": "hi"}]]}), no_reward)
    with pytest.raises(KeyError, match=r"no column 'reward_model'; columns present: \['data_source', 'prompt'\]"):
        RLDataset(str(no_reward), tokenizer, 48)
    with pytest.raises(KeyError, match="no column 'question'"):
        RLDataset(_write(tmp_path / "d.parquet", ["hi"]), tokenizer, 48, prompt_key="question")
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"data_source": pa.array([], pa.string())}), empty)
    with pytest.raises(ValueError, match="has no rows"):
        RLDataset(str(empty), tokenizer, 48)
    with pytest.raises(TypeError, match="row 0: column 'prompt' must hold a list"):
        RLDataset(_write(tmp_path / "s.parquet", ["hi"], prompt=["plain string"]), tokenizer, 48)


def test_several_files_and_synthetic_data(tokenizer, tmp_path) -> None:
    train, val = write_synthetic_dataset(tmp_path, train_size=12, val_size=4, tasks=["char_class", "arithmetic"])
    dataset = RLDataset([str(train), str(val)], tokenizer, max_prompt_length=96)
    assert len(dataset) == 16
    assert [dataset[i]["index"] for i in range(16)] == list(range(12)) + list(range(4))


def test_collate_to_dataproto(tokenizer, tmp_path) -> None:
    dataset = RLDataset(_write(tmp_path / "d.parquet", ["a", "bb", "ccc"]), tokenizer, 40)
    batch = collate_to_dataproto([dataset[i] for i in range(3)])
    assert isinstance(batch, DataProto) and len(batch) == 3
    assert set(batch.batch.keys()) == {"input_ids", "attention_mask", "position_ids"}
    assert batch.batch["input_ids"].shape == (3, 40)
    nt = batch.non_tensor_batch
    assert set(nt) == {"data_source", "reward_model", "extra_info", "raw_prompt", "index"}
    assert all(a.dtype == object and a.shape == (3,) for a in nt.values())
    assert nt["raw_prompt"][2] == [{"role": "user", "content": "ccc"}]  # equal-length lists stay 1-D
    with pytest.raises(ValueError, match="at least one item"):
        collate_to_dataproto([])
    with pytest.raises(KeyError, match="item 1 has keys"):
        collate_to_dataproto([{"a": 1}, {"b": 2}])


def test_sampler_epochs_are_seeded_permutations() -> None:
    sampler = ResumableBatchSampler(10, 3, shuffle=True, seed=1, drop_last=True)
    assert len(sampler) == 3
    epoch0 = [sampler.next_indices() for _ in range(3)]
    epoch1 = [sampler.next_indices() for _ in range(3)]
    assert sampler.epoch == 1
    assert all(len(b) == 3 for b in epoch0 + epoch1)
    assert len(set(sum(epoch0, []))) == 9 and epoch0 != epoch1
    again = ResumableBatchSampler(10, 3, shuffle=True, seed=1)
    assert [again.next_indices() for _ in range(3)] == epoch0
    ordered = ResumableBatchSampler(5, 2, shuffle=False, drop_last=False)
    assert [ordered.next_indices() for _ in range(4)] == [[0, 1], [2, 3], [4], [0, 1]]
    with pytest.raises(ValueError, match="make no batch"):
        ResumableBatchSampler(3, 4)


def test_dataloader_state_round_trip(tokenizer, tmp_path) -> None:
    path = _write(tmp_path / "d.parquet", [f"prompt {i}" for i in range(10)])
    dataset = RLDataset(path, tokenizer, 40)
    loader = make_dataloader(dataset, batch_size=4, shuffle=True, seed=7)  # 2 batches per epoch
    stream = iter(loader)
    first_three = [next(stream) for _ in range(3)]
    state = loader.state_dict()
    fourth = next(stream)
    assert state["epoch"] == 1 and state["position"] == 1
    assert list(first_three[0].non_tensor_batch["index"]) != list(first_three[2].non_tensor_batch["index"])

    resumed = make_dataloader(RLDataset(path, tokenizer, 40), batch_size=4, shuffle=True, seed=7)
    resumed.load_state_dict(state)
    again = next(iter(resumed))
    assert torch.equal(again.batch["input_ids"], fourth.batch["input_ids"])
    assert list(again.non_tensor_batch["index"]) == list(fourth.non_tensor_batch["index"])

    with pytest.raises(ValueError, match="seed=7 but this sampler has 8"):
        make_dataloader(dataset, batch_size=4, seed=8).load_state_dict(state)


def test_return_raw_chat_keeps_or_drops_the_messages(tokenizer, tmp_path) -> None:
    """verl's data.return_raw_chat: the chat messages travel as non_tensor_batch['raw_prompt'] (the default)."""
    from trainer.config_loader import load_config

    path = _write(tmp_path / "d.parquet", ["a", "bb"])
    assert load_config([]).data.return_raw_chat is True
    kept = collate_to_dataproto([RLDataset(path, tokenizer, 40)[i] for i in range(2)])
    assert kept.non_tensor_batch["raw_prompt"][1] == [{"role": "user", "content": "bb"}]
    dropped = RLDataset(path, tokenizer, 40, return_raw_chat=False)
    batch = collate_to_dataproto([dropped[i] for i in range(2)])
    assert "raw_prompt" not in batch.non_tensor_batch and torch.equal(batch.batch["input_ids"], kept.batch["input_ids"])
