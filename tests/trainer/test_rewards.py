"""Scorers, the data_source table, reward function loading, and RuleRewardManager."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from protocol import DataProto
from trainer.rewards import (
    RuleRewardManager,
    compute_char_class_score,
    compute_math_answer_score,
    compute_score,
    extract_answer,
    last_valid_positions,
    load_reward_function,
)
from trainer.tiny_model import build_char_tokenizer


@pytest.mark.parametrize(
    ("response", "target", "expected"),
    [
        ("12345678", "digits:8", 1.0),
        ("1234567890abc", "digits:8", 1.0),  # only the first 8 characters count
        ("1234abcd", "digits:8", 0.5),
        ("12", "digits:8", 0.25),  # too short: missing characters are wrong
        ("xyz", "digits:8", 0.0),
        ("", "digits:8", 0.0),
        ("aEiOuaei", "vowels:8", 1.0),
        ("a b c d ", "vowels:8", 0.125),
        ("aeio", "vowels", 0.5),  # bare class name: length 8
        ("1+2=3#", "symbols:4", 0.5),
    ],
)
def test_char_class_score(response: str, target: str, expected: float) -> None:
    assert compute_char_class_score(response, target) == pytest.approx(expected)
    assert compute_score("synthetic/char_class", response, target) == pytest.approx(expected)


def test_char_class_bad_ground_truth() -> None:
    with pytest.raises(ValueError, match="unknown class 'emoji'"):
        compute_char_class_score("x", "emoji:8")
    with pytest.raises(ValueError, match="not an integer"):
        compute_char_class_score("x", "digits:eight")


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("12 + 21 = 33\n#### 33", "33", 1.0),
        ("#### 33.", "33", 1.0),
        ("####33.0", "33", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### $18", "18", 1.0),
        ("#### -57", "-57", 1.0),
        ("format is #### n. so #### 32", "33", 0.0),  # wrong: last #### counts
        ("#### 33 ... wait #### 34", "33", 0.0),
        ("the answer is 33", "33", 0.0),  # no #### at all
        ("####", "33", 0.0),
    ],
)
def test_math_answer_score(response: str, truth: str, expected: float) -> None:
    for source in ("synthetic/arithmetic", "openai/gsm8k"):
        assert compute_score(source, response, truth) == expected


def test_math_answer_format_score_and_extraction() -> None:
    assert compute_math_answer_score("#### 32", "33", format_score=0.1) == 0.1
    assert compute_math_answer_score("no answer", "33", format_score=0.1) == 0.0
    assert extract_answer("a #### 1,234.50 b") == "1234.50"
    assert extract_answer("nothing") is None


def test_unknown_data_source_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'my/data'.*openai/gsm8k.*synthetic/arithmetic.*synthetic/char_class"):
        compute_score("my/data", "x", "y")


# ---------------------------------------------------------------- load_reward_function

REWARD_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)

def length_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str))

NOT_A_FUNCTION = 3
"""


def test_load_default_and_dotted_path(tmp_path, monkeypatch) -> None:
    assert load_reward_function(None) is compute_score
    assert load_reward_function("trainer.rewards") is compute_score
    (tmp_path / "my_rewards_pkg").mkdir()
    (tmp_path / "my_rewards_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_rewards_pkg" / "scoring.py").write_text(REWARD_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward_function("my_rewards_pkg.scoring", name="length_score")
    assert fn("d", "abcd", "x") == 4.0


def test_load_from_file(tmp_path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_SOURCE)
    assert load_reward_function(str(path))("d", "yes", "yes") == 1.0
    assert load_reward_function(str(path), name="length_score")("d", "ab", "x") == 2.0


def test_load_errors(tmp_path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_SOURCE)
    with pytest.raises(FileNotFoundError, match="missing.py"):
        load_reward_function(str(tmp_path / "missing.py"))
    with pytest.raises(ModuleNotFoundError, match="no_such_pkg_xyz"):
        load_reward_function("no_such_pkg_xyz.rewards")
    with pytest.raises(AttributeError, match=r"'nope'.*compute_score.*length_score"):
        load_reward_function(str(path), name="nope")
    with pytest.raises(TypeError, match="NOT_A_FUNCTION"):
        load_reward_function(str(path), name="NOT_A_FUNCTION")
    broken = tmp_path / "broken_dep.py"
    broken.write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):  # the real cause, not "file missing"
        load_reward_function(str(broken))


# ---------------------------------------------------------------- RuleRewardManager


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _batch(
    tokenizer, texts: list[str], sources: list[str], truths: list[str], width: int = 12, eos: bool = True
) -> DataProto:
    rows, masks = [], []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])
        ids = ids[:width]
        rows.append(ids + [tokenizer.pad_token_id] * (width - len(ids)))
        masks.append([1] * len(ids) + [0] * (width - len(ids)))
    return DataProto.from_dict(
        {"responses": torch.tensor(rows), "response_mask": torch.tensor(masks)},
        {
            "data_source": np.array(sources, dtype=object),
            "reward_model": [{"style": "rule", "ground_truth": t} for t in truths],
            "extra_info": [{"index": i} for i in range(len(texts))],
        },
    )


def test_last_valid_positions() -> None:
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    assert last_valid_positions(mask).tolist() == [1, 3, -1, 2]


def test_manager_places_score_on_last_valid_token(tokenizer) -> None:
    data = _batch(
        tokenizer,
        ["1234abcd", "12", "#### 33", "#### 7"],
        ["synthetic/char_class", "synthetic/char_class", "synthetic/arithmetic", "openai/gsm8k"],
        ["digits:8", "digits:8", "33", "8"],
    )
    scores, metrics = RuleRewardManager(tokenizer)(data)
    mask = data.batch["response_mask"]
    assert scores.shape == mask.shape and scores.dtype == torch.float32
    expected = [0.5, 0.25, 1.0, 0.0]
    lengths = mask.sum(1).tolist()  # 8+1, 2+1, 7+1, 6+1 with eos
    for i, (score, length) in enumerate(zip(expected, lengths)):
        assert scores[i, length - 1].item() == pytest.approx(score)
        assert scores[i].sum().item() == pytest.approx(score)  # zeros elsewhere
    assert metrics == {
        "synthetic/char_class/mean": pytest.approx(0.375),
        "synthetic/arithmetic/mean": 1.0,
        "openai/gsm8k/mean": 0.0,
    }


def test_manager_truncated_response_and_custom_function(tokenizer, capsys) -> None:
    seen = []

    def record(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 2

    data = _batch(tokenizer, ["abcdefghijklmnop"], ["mine"], ["t"], width=6, eos=False)
    scores, _ = RuleRewardManager(tokenizer, compute_score=record, num_examine=1)(data)
    assert seen == [("mine", "abcdef", "t", {"index": 0})]
    assert scores[0].tolist() == [0, 0, 0, 0, 0, 2.0]
    assert "data_source=mine" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("returned", "error", "pattern"),
    [
        ("0.5", TypeError, r"returned '0.5' \(str\) for sample 1 \(data_source='b'\)"),
        (None, TypeError, r"returned None .*sample 1"),
        (float("nan"), ValueError, r"returned nan for sample 1"),
    ],
)
def test_manager_rejects_non_numbers(tokenizer, returned, error, pattern) -> None:
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if data_source == "a" else returned

    data = _batch(tokenizer, ["x", "y"], ["a", "b"], ["t", "t"])
    with pytest.raises(error, match=pattern):
        RuleRewardManager(tokenizer, compute_score=scorer)(data)


def test_manager_wraps_scorer_exceptions(tokenizer) -> None:
    data = _batch(tokenizer, ["x", "y"], ["synthetic/char_class", "unknown/source"], ["digits:8", "t"])
    with pytest.raises(RuntimeError, match=r"sample 1 \(data_source='unknown/source'\).*no default scorer"):
        RuleRewardManager(tokenizer)(data)


def test_manager_missing_keys(tokenizer) -> None:
    data = _batch(tokenizer, ["x"], ["a"], ["t"])
    with pytest.raises(KeyError, match="data_source"):
        RuleRewardManager(tokenizer)(data.select(non_tensor_batch_keys=["reward_model"]))
    with pytest.raises(KeyError, match="response_mask"):
        RuleRewardManager(tokenizer)(data.select(batch_keys=["responses"]))
