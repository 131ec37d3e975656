"""Every listed bad input gives one clear error naming the problem (and, for the trainer, fails before any
worker starts, so nothing is lost): DataProto misuse, config keys and values, model/tokenizer/data paths,
long prompts, reward functions, resume paths."""

import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from protocol import DataProto
from tests.reliability.conftest import short_run
from trainer import checkpointing
from trainer.config_loader import ConfigError, load_config
from trainer.data import RLDataset
from trainer.data_counts import describe, prompt_counts
from trainer.main import main, run
from trainer.preflight import InputError
from trainer.rewards import RuleRewardManager

# ---- DataProto -----------------------------------------------------------------------------------------


def test_dataproto_mismatched_lengths():
    with pytest.raises(ValueError, match=r"non_tensors\['uid'\] has length 2 but 'x' has length 3"):
        DataProto.from_dict({"x": torch.zeros(3)}, {"uid": ["a", "b"]})


def test_dataproto_unknown_keys_in_select():
    data = DataProto.from_dict({"x": torch.zeros(3)}, {"uid": ["a", "b", "c"]})
    with pytest.raises(KeyError, match=r"batch key\(s\) \['y'\] not found; available batch keys: \['x'\]"):
        data.select(batch_keys=["y"])
    with pytest.raises(KeyError, match=r"\['nope'\] not found"):
        data.select(non_tensor_batch_keys=["nope"])


def test_dataproto_non_divisible_chunks_without_padding():
    with pytest.raises(ValueError, match=r"cannot chunk a DataProto of length 5 into 2 equal chunks; pad it first"):
        DataProto.from_dict({"x": torch.zeros(5)}).chunk(2)


def test_dataproto_wrong_dtypes_and_devices():
    ints = DataProto.from_dict({"x": torch.zeros(3, dtype=torch.long)})
    floats = DataProto.from_dict({"x": torch.zeros(2, dtype=torch.float32)})
    with pytest.raises(ValueError, match=r"concat: batch key 'x' is int64\[3\] on cpu in item 0 but float32\[2\] on cpu in item 1"):
        DataProto.concat([ints, floats])
    with pytest.raises(ValueError, match=r"union: batch key 'x' is in both DataProtos with different dtypes"):
        ints.union(DataProto.from_dict({"x": torch.zeros(3)}))
    # "meta" stands in for another device on a CPU-only machine.
    elsewhere = DataProto.from_dict({"y": torch.zeros(3, device="meta")})
    with pytest.raises(ValueError, match=r"union: batch key 'y' is on meta but this DataProto's tensors are on cpu"):
        ints.union(elsewhere)


# ---- configuration -------------------------------------------------------------------------------------


def test_unknown_config_key_lists_the_valid_ones(capsys):
    assert main(["trainer.max_ckpt_to_kep=2"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'trainer.max_ckpt_to_kep'; did you mean 'trainer.max_ckpt_to_keep'?" in err


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algorithm.adv_estimator=ppo2", "algorithm.adv_estimator='ppo2' is not valid; choose one of ['gae', 'grpo'"),
        ("data.truncation=cut", "data.truncation='cut' is not valid; choose one of ['error', 'left', 'right', 'filter']"),
        ("trainer.call_timeout_s=-1", "trainer.call_timeout_s=-1 must be null (off) or a positive number"),
        ("trainer.max_ckpt_to_keep=0", "trainer.max_ckpt_to_keep=0 must be null (off) or a positive integer"),
    ],
)
def test_invalid_config_values_list_what_is_valid(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert expected in str(info.value)


def test_lora_with_the_megatron_backend_is_refused_before_ray_starts(small_assets, tmp_path, capsys):
    overrides = short_run(small_assets, tmp_path, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.strategy=megatron")
    assert main(overrides) == 2
    err = capsys.readouterr().err
    assert "error: actor_rollout_ref.model.lora_rank=8 needs actor_rollout_ref.actor.strategy=fsdp" in err
    assert not (tmp_path / "logs").exists()  # refused by the input checks, before the run set anything up


# ---- model, tokenizer, data (the trainer fails before starting any worker) -----------------------------


def test_missing_model_path(small_assets, tmp_path):
    cfg = load_config(short_run({**small_assets, "model": str(tmp_path / "nowhere")}, tmp_path))
    with pytest.raises(InputError, match=r"actor_rollout_ref.model.path='.*nowhere' is not a folder"):
        run(cfg)


def test_model_folder_without_tokenizer(small_assets, tmp_path):
    # transformers would silently build an empty tokenizer from such a folder.
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(f"{small_assets['model']}/{name}", model)
    cfg = load_config(short_run({**small_assets, "model": str(model)}, tmp_path))
    with pytest.raises(InputError, match=r"has no tokenizer \(looked for any of \['tokenizer.json'"):
        run(cfg)


def _write_parquet(table, path):
    pq.write_table(table, path)
    return str(path)


def test_dataset_missing_a_required_column(small_assets, tmp_path):
    table = pq.read_table(small_assets["train"]).drop_columns(["reward_model"])
    train = _write_parquet(table, tmp_path / "no_reward_model.parquet")
    with pytest.raises(InputError, match=r"has no column 'reward_model' \(verl's layout needs it\); columns present: \["):
        run(load_config(short_run({**small_assets, "train": train}, tmp_path)))


def test_dataset_with_an_empty_split(small_assets, tmp_path):
    train = _write_parquet(pq.read_table(small_assets["train"]).slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(InputError, match=r"data.train_files: parquet file .*empty.parquet has no rows"):
        run(load_config(short_run({**small_assets, "train": train}, tmp_path)))


def test_missing_data_file(small_assets, tmp_path):
    missing = tmp_path / "train.parquet"
    with pytest.raises(InputError, match=rf"data.train_files: no such file \['{missing}'\]"):
        run(load_config(short_run({**small_assets, "train": str(missing)}, tmp_path)))


def test_prompt_longer_than_max_length(ray_cluster, small_assets, tmp_path):
    with pytest.raises(ValueError, match=r"row \d+: prompt is \d+ tokens, longer than max_prompt_length=40 "
                                         r"\(set data.truncation to 'left', 'right' or 'filter'"):
        run(load_config(short_run(small_assets, tmp_path, "data.max_prompt_length=40")))


@pytest.mark.parametrize("mode", ["left", "filter"])
def test_long_prompts_are_truncated_or_filtered_and_counted(small_assets, mode):
    from transformers import AutoTokenizer

    dataset = RLDataset(small_assets["train"], AutoTokenizer.from_pretrained(small_assets["model"]), 45, truncation=mode)
    counts = prompt_counts(dataset)
    cut = counts["data/truncated_prompts" if mode == "left" else "data/filtered_prompts"]
    assert cut > 0 and counts["data/prompts"] == 64 - (cut if mode == "filter" else 0)
    assert f"{cut} {'truncated' if mode == 'left' else 'filtered'}" in describe(counts, 45, mode)


# ---- reward functions ----------------------------------------------------------------------------------


def _rollout(n: int = 2) -> DataProto:
    return DataProto.from_dict(
        {"responses": torch.full((n, 3), 5), "response_mask": torch.ones(n, 3, dtype=torch.long)},
        {"data_source": ["synthetic/char_class"] * n, "reward_model": [{"ground_truth": "digits:3"}] * n},
    )


@pytest.fixture(scope="module")
def tokenizer(small_assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(small_assets["model"])


def test_reward_function_that_raises(tokenizer):
    def broken(data_source, solution_str, ground_truth, extra_info=None):
        raise ConnectionError("judge offline")

    with pytest.raises(RuntimeError, match=r"reward function failed on sample 0 \(data_source='synthetic/char_class'\): "
                                           r"ConnectionError: judge offline"):
        RuleRewardManager(tokenizer, compute_score=broken)(_rollout())


@pytest.mark.parametrize("returned", [[1.0, 0.0], np.zeros(3), None])
def test_reward_function_returning_the_wrong_shape(tokenizer, returned):
    with pytest.raises(TypeError, match=r"reward function returned .* for sample 0 .*; expected a number"):
        RuleRewardManager(tokenizer, compute_score=lambda *args, **kwargs: returned)(_rollout())


# ---- checkpoints ---------------------------------------------------------------------------------------


def test_explicit_resume_path_that_is_partial(small_assets, tmp_path):
    partial = tmp_path / "global_step_3"
    (partial / "actor").mkdir(parents=True)
    cfg = load_config(short_run(small_assets, tmp_path, f"trainer.resume_mode={partial}"))
    with pytest.raises(checkpointing.CheckpointError, match=r"is not a complete checkpoint folder: it has no MANIFEST.json"):
        run(cfg)


def test_auto_resume_with_only_damaged_checkpoints_stops_before_starting(small_assets, tmp_path):
    (tmp_path / "global_step_5" / "actor").mkdir(parents=True)  # e.g. a partial copy from another machine
    cfg = load_config(short_run(small_assets, tmp_path))
    with pytest.raises(checkpointing.CheckpointError, match=r"none is whole:\n  global_step_5: it has no MANIFEST.json"):
        run(cfg)
