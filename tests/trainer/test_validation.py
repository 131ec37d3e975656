"""Validation as verl's keys say: rollout.val_kwargs (greedy by default, n samples per prompt with mean@n) and
trainer.log_val_generations (samples to the trackers), with a generator that answers without a model."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

from protocol import DataProto
from trainer.config_loader import load_config
from trainer.rewards import RuleRewardManager
from trainer.run_data import RunData
from trainer.step_loop import StepLoop
from trainer.tiny_model import build_char_tokenizer
from trainer.trackers.jsonl import GENERATIONS_FILE, JsonlTracker
from trainer.trackers.tensorboard import TensorBoardTracker
from trainer.tracking import Tracker
from trainer.validation import ValSampling, validate

RESPONSE = 10


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def _prompts(tokenizer, texts: list[str], width: int = 8) -> DataProto:
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"][-width:] for t in texts]
    rows = [[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids]
    mask = [[0] * (width - len(i)) + [1] * len(i) for i in ids]
    return DataProto.from_dict(
        {"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(mask),
         "position_ids": torch.zeros(len(rows), width, dtype=torch.long)},
        {"data_source": np.array(["synthetic/char_class"] * len(texts), dtype=object),
         "reward_model": [{"style": "rule", "ground_truth": "digits:8"} for _ in texts]},
    )


class ScriptedGenerator:
    """Answers row i of each call with `answers[i % len(answers)]` (sampling) or the first answer (greedy);
    records every call's batch."""

    def __init__(self, tokenizer, answers: list[str]) -> None:
        self.tokenizer, self.answers, self.calls = tokenizer, answers, []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append(prompts)
        sampling = prompts.meta_info.get("do_sample", True)
        texts = [self.answers[i % len(self.answers)] if sampling else self.answers[0] for i in range(len(prompts))]
        eos = [self.tokenizer.eos_token_id]
        ids = [(self.tokenizer(t, add_special_tokens=False)["input_ids"] + eos)[:RESPONSE] for t in texts]
        responses = torch.tensor([i + [self.tokenizer.pad_token_id] * (RESPONSE - len(i)) for i in ids])
        response_mask = torch.tensor([[1] * len(i) + [0] * (RESPONSE - len(i)) for i in ids])
        out = DataProto.from_dict(
            {"responses": responses, "response_mask": response_mask,
             "attention_mask": torch.cat([prompts.batch["attention_mask"], response_mask], dim=1)},
            dict(prompts.non_tensor_batch),
        )
        return out


def test_greedy_by_default(tokenizer):
    sampling = ValSampling.from_config(load_config([]).actor_rollout_ref.rollout.val_kwargs)
    assert sampling == ValSampling() and not sampling.samples and sampling.meta_info() == {"do_sample": False}
    generator = ScriptedGenerator(tokenizer, ["12345678", "abcd"])
    result = validate(generator, [_prompts(tokenizer, ["a", "b", "c"])], RuleRewardManager(tokenizer), sampling)
    (call,) = generator.calls
    assert len(call) == 3 and "seed" not in call.meta_info
    assert result.metrics == {"val/reward_mean": 1.0, "val/synthetic/char_class/reward_mean": 1.0}
    assert result.generations == []


def test_val_kwargs_n_samples_every_prompt_n_times(tokenizer):
    cfg = load_config([
        "actor_rollout_ref.rollout.val_kwargs.n=2", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.7", "actor_rollout_ref.rollout.val_kwargs.top_p=0.9",
    ])
    sampling = ValSampling.from_config(cfg.actor_rollout_ref.rollout.val_kwargs)
    generator = ScriptedGenerator(tokenizer, ["12345678", "1234"])  # a prompt's two samples score 1.0 and 0.5
    batch = _prompts(tokenizer, ["a", "bb", "ccc"])
    result = validate(generator, [batch], RuleRewardManager(tokenizer), sampling, seed=3, step=7)
    (call,) = generator.calls
    assert len(call) == 6
    assert torch.equal(call.batch["input_ids"][0::2], batch.batch["input_ids"])  # each prompt twice, adjacent
    assert torch.equal(call.batch["input_ids"][1::2], batch.batch["input_ids"])
    assert {k: call.meta_info[k] for k in ("do_sample", "temperature", "top_p", "top_k")} == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 0}
    assert isinstance(call.meta_info["seed"], int)
    again = ScriptedGenerator(tokenizer, ["x"])
    validate(again, [batch], RuleRewardManager(tokenizer), sampling, seed=3, step=8)
    assert again.calls[0].meta_info["seed"] != call.meta_info["seed"]  # a fresh seed per validation
    metrics = result.metrics
    assert metrics["val/reward_mean"] == pytest.approx(0.75)
    assert metrics["val/synthetic/char_class/reward/mean@2"] == pytest.approx(0.75)
    assert metrics["val/synthetic/char_class/reward/std@2"] == pytest.approx(0.25)


def test_temperature_zero_is_greedy_even_with_do_sample():
    assert ValSampling(do_sample=True, temperature=0).meta_info() == {"do_sample": False}


def _loop(cfg, tokenizer, generator, tracker) -> StepLoop:
    """A StepLoop with only what validate() reads (no workers, no dataloader)."""
    loop = StepLoop.__new__(StepLoop)
    batches = [_prompts(tokenizer, ["a", "bb", "ccc", "dddd"]), _prompts(tokenizer, ["e"])]
    loop.cfg, loop.rollout_source, loop.tracker, loop.global_step = cfg, generator, tracker, 20
    loop.data = RunData(tokenizer, None, batches, RuleRewardManager(tokenizer), {})
    return loop


def test_log_val_generations_reaches_the_trackers(tokenizer, tmp_path):
    cfg = load_config(["trainer.log_val_generations=3"])
    printed: list[str] = []
    tracker = Tracker(["console", "jsonl"], tmp_path, print_fn=printed.append)
    loop = _loop(cfg, tokenizer, ScriptedGenerator(tokenizer, ["12345678"]), tracker)
    metrics = loop.validate()
    tracker.close()
    assert metrics["val/reward_mean"] == 1.0
    records = [json.loads(line) for line in (tmp_path / GENERATIONS_FILE).read_text().splitlines()]
    assert len(records) == 3
    assert all(r["step"] == 20 and r["output"] == "12345678" and r["score"] == 1.0 for r in records)
    assert {r["input"] for r in records} <= {"a", "bb", "ccc", "dddd", "e"} and len({r["input"] for r in records}) == 3
    assert len([line for line in printed if line.startswith("step 20 val: [input]")]) == 3
    assert not (tmp_path / "metrics.jsonl").read_text()  # samples stay out of the step metrics


def test_no_generations_by_default(tokenizer, tmp_path):
    tracker = Tracker(["jsonl"], tmp_path)
    _loop(load_config([]), tokenizer, ScriptedGenerator(tokenizer, ["1"]), tracker).validate()
    tracker.close()
    assert not (tmp_path / GENERATIONS_FILE).exists()


def test_jsonl_generations_of_a_stopped_run_are_dropped_on_resume(tmp_path):
    first = JsonlTracker(tmp_path)
    for step in (10, 20):
        first.log_generations([{"input": "q", "output": "a", "score": 1.0}], step)
    first.finish()
    JsonlTracker(tmp_path, resume_step=10).finish()
    assert [json.loads(line)["step"] for line in (tmp_path / GENERATIONS_FILE).read_text().splitlines()] == [10]


def test_tensorboard_writes_a_text_table(tmp_path):
    texts = []

    class Writer:
        def add_text(self, tag, text, step):
            texts.append((tag, text, step))

        def close(self):
            pass

    tracker = TensorBoardTracker(tmp_path)
    tracker.writer.close()
    tracker.writer = Writer()
    tracker.log_generations([{"input": "a|b", "output": "x\ny", "score": 0.5}], 4)
    ((tag, text, step),) = texts
    assert tag == "val/generations" and step == 4
    assert text.splitlines()[-1] == "| a\\|b | x<br>y | 0.5 |"
