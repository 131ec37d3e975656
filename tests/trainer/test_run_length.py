"""verl's run-length and schedule keys, checked without workers: the step count (`trainer.total_training_steps`,
`trainer.total_epochs`), `trainer.critic_warmup`, `data.filter_overlong_prompts` and the LR warmup from
`optim.lr_warmup_steps` / `lr_warmup_steps_ratio`."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.config_loader import ConfigError, load_config
from trainer.critic_warmup import actor_trains
from trainer.data import RLDataset
from trainer.role_groups import actor_worker_config, critic_worker_config
from trainer.step_count import (
    batches_per_epoch,
    resolve_training_steps,
    total_training_steps,
)
from trainer.tiny_model import build_char_tokenizer
from workers.fsdp.optim import lr_factor_fn, warmup_steps


# ---- trainer.total_training_steps / total_epochs ------------------------------------------------------------
@pytest.mark.parametrize(("prompts", "batch", "epochs", "explicit"), [
    (1024, 16, 1, None), (1000, 16, 3, None), (1024, 16, 30, None), (1024, 16, 5, 7), (47, 16, 2, None),
])
def test_the_step_count_is_whole_batches_per_epoch_times_epochs_unless_set(prompts, batch, epochs, explicit):
    per_epoch = batches_per_epoch(prompts, batch)
    assert per_epoch * batch <= prompts < (per_epoch + 1) * batch  # the last partial batch is dropped
    steps = total_training_steps(explicit, epochs, per_epoch)
    assert steps == (explicit if explicit is not None else per_epoch * epochs)


def test_the_default_is_null_and_the_resolved_count_reaches_the_optimizers(capsys):
    cfg = load_config(["algorithm=ppo", "trainer.total_epochs=3"])
    assert cfg.trainer.total_training_steps is None  # `--cfg job` shows null: the count needs the data
    assert resolve_training_steps(cfg, 64) == 192 and cfg.trainer.total_training_steps == 192
    assert "192 (64 batches per epoch x trainer.total_epochs=3)" in capsys.readouterr().out
    assert actor_worker_config(cfg)["actor"]["optim"]["total_training_steps"] == 192
    assert critic_worker_config(cfg)["optim"]["total_training_steps"] == 192
    explicit = load_config(["trainer.total_training_steps=7", "trainer.total_epochs=3"])
    assert resolve_training_steps(explicit, 64) == 7


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.total_epochs=0", "trainer.total_epochs=0 must be a positive integer"),
    ("trainer.total_training_steps=0", "trainer.total_training_steps=0 must be null"),
    ("trainer.critic_warmup=2",
     "trainer.critic_warmup=2 updates only the critic .* algorithm.adv_estimator='grpo' trains no critic"),
    ("trainer.critic_warmup=-1", r"trainer.critic_warmup=-1 must be an integer >= 0"),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type=linear",
     r"'actor_rollout_ref.actor.optim.lr_scheduler_type' must be one of \['constant', 'cosine'\], got 'linear'"),
])
def test_bad_values_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([override])


# ---- trainer.critic_warmup ---------------------------------------------------------------------------------
def test_critic_warmup_zero_is_always_accepted_and_n_steps_skip_the_actor():
    assert load_config(["trainer.critic_warmup=0"]).trainer.critic_warmup == 0  # verl's GRPO scripts pass it
    assert load_config(["algorithm=ppo", "trainer.critic_warmup=2"]).trainer.critic_warmup == 2
    for warmup in (0, 1, 3):
        updated = [actor_trains(done, warmup) for done in range(5)]  # steps 1..5
        assert updated == [step > warmup for step in range(1, 6)]


# ---- data.filter_overlong_prompts ---------------------------------------------------------------------------
def _prompts_file(path, contents: list[str]) -> str:
    pq.write_table(pa.table({
        "data_source": ["synthetic/char_class"] * len(contents),
        "prompt": [[{"role": "user", "content": c}] for c in contents],
        "reward_model": [{"style": "rule", "ground_truth": "digits:8"}] * len(contents),
    }), path)
    return str(path)


@pytest.mark.parametrize("truncation", ["error", "left", "right", "filter"])
def test_filter_overlong_prompts_drops_long_rows_whatever_truncation_says(tmp_path, truncation):
    tokenizer = build_char_tokenizer()
    contents = ["hi", "write 8 digits.", "x" * 40, "give me 8 vowels, nothing else.", "y" * 60, "ok"]
    path = _prompts_file(tmp_path / "p.parquet", contents)
    lengths = [len(RLDataset(_prompts_file(tmp_path / f"{i}.parquet", [c]), tokenizer, 512)._input_ids[0])
               for i, c in enumerate(contents)]
    limit = sorted(lengths)[3]  # some rows fit, some do not
    kept = RLDataset(path, tokenizer, limit, truncation=truncation, filter_overlong_prompts=True)
    assert kept.num_filtered == sum(n > limit for n in lengths) > 0 and kept.num_truncated == 0
    kept_contents = [row["raw_prompt"][0]["content"] for row in kept._rows]
    assert kept_contents == [c for c, n in zip(contents, lengths) if n <= limit]
    if truncation == "error":  # without the key the long rows are an error, as before
        with pytest.raises(ValueError, match="filter_overlong_prompts=true"):
            RLDataset(path, tokenizer, limit, truncation="error")


def test_filter_overlong_prompts_is_a_bool_key():
    assert load_config([]).data.filter_overlong_prompts is False
    assert load_config(["data.filter_overlong_prompts=True"]).data.filter_overlong_prompts is True  # verl's spelling
    with pytest.raises(ConfigError, match="data.filter_overlong_prompts='yes' is not valid"):
        load_config(["data.filter_overlong_prompts=yes"])


# ---- optim.lr_warmup_steps / lr_warmup_steps_ratio / num_cycles ---------------------------------------------
def _optim(**overrides):
    return {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0, "lr_scheduler_type": "constant",
            "total_training_steps": None, "min_lr_ratio": 0.0, "num_cycles": 0.5, **overrides}


@pytest.mark.parametrize(
    ("steps", "ratio", "total"), [(-1, 0.1, 50), (0, 0.25, 10), (None, 0.3, 7), (3, 0.5, 40), (-1, 0.0, 40)]
)
def test_warmup_comes_from_the_ratio_when_lr_warmup_steps_is_not_positive(steps, ratio, total):
    expected = steps if steps is not None and steps > 0 else int(ratio * total)
    optim = _optim(lr_warmup_steps=steps, lr_warmup_steps_ratio=ratio, total_training_steps=total)
    assert warmup_steps(optim) == expected
    factor = lr_factor_fn(optim)
    assert [factor(s) for s in range(expected + 2)] == [(s + 1) / expected for s in range(expected)] + [1.0, 1.0]


def test_a_warmup_ratio_needs_the_step_count():
    with pytest.raises(ValueError, match="lr_warmup_steps_ratio=0.1 needs optim.total_training_steps"):
        lr_factor_fn(_optim(lr_warmup_steps_ratio=0.1))


def test_cosine_num_cycles():
    half = lr_factor_fn(_optim(lr_scheduler_type="cosine", total_training_steps=20, min_lr_ratio=0.2))
    full = lr_factor_fn(_optim(lr_scheduler_type="cosine", total_training_steps=20, min_lr_ratio=0.2, num_cycles=1.0))
    assert half(0) == full(0) == pytest.approx(1.0)
    assert half(10) == pytest.approx(0.6) and half(20) == pytest.approx(0.2)  # one half-wave down to the floor
    assert full(10) == pytest.approx(0.2) and full(20) == pytest.approx(1.0)  # down and back up
    assert half(5) == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_the_renamed_optim_keys_are_the_config_keys():
    optim = load_config(["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"]).actor_rollout_ref.actor.optim
    assert optim.lr_warmup_steps == -1 and optim.lr_warmup_steps_ratio == 0.1 and optim.lr_scheduler_type == "constant"
    for old in ("actor_rollout_ref.actor.optim.warmup_steps=3", "critic.optim.lr_scheduler=cosine"):
        with pytest.raises(ConfigError):
            load_config([old])
