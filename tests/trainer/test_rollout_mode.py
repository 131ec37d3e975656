"""rollout.mode is verl's key (sync | async, default async), which picks nothing here and says so once per run;
fully asynchronous training is rollout.async_training, and the old spelling of it (mode=async with its keys) fails
in one line naming the new key. Config level only, no Ray."""

import pytest

from trainer.config_loader import ConfigError, load_config
from trainer.role_groups import engine_decode_batch
from workers.config import actor_rollout_ref_config

SEPARATE = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.placement=separate")
NEW_KEY = "actor_rollout_ref.rollout.async_training=true"


def test_defaults_follow_verl_and_keep_training_synchronous():
    rollout = load_config().actor_rollout_ref.rollout
    assert (rollout.mode, rollout.async_training) == ("async", False)
    worker = actor_rollout_ref_config({"model": {"path": "m"}})["rollout"]  # the workers' own defaults agree with the driver's
    assert (worker["mode"], worker["async_training"]) == ("async", False)


@pytest.mark.parametrize("extra", [(), SEPARATE], ids=["hf", "vllm_separate"])
def test_both_verl_values_load_and_give_the_same_run(extra):
    by_mode = {mode: load_config([*extra, f"actor_rollout_ref.rollout.mode={mode}"]) for mode in ("sync", "async")}
    for cfg in by_mode.values():
        cfg.actor_rollout_ref.rollout.mode = None  # the one difference the configs may have
    assert by_mode["sync"] == by_mode["async"]
    assert engine_decode_batch(by_mode["sync"]) == engine_decode_batch(by_mode["async"])


def test_a_value_verl_does_not_have_is_refused():
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.rollout.mode' must be one of \['sync', 'async'\].*got 'server'"):
        load_config(["actor_rollout_ref.rollout.mode=server"])


def test_async_training_turns_the_stream_on_and_is_a_bool():
    cfg = load_config([*SEPARATE, NEW_KEY, "actor_rollout_ref.rollout.max_staleness=2"])
    assert cfg.actor_rollout_ref.rollout.async_training is True
    # The stream keeps max_staleness + 1 batches out: the engines decode more at once than one batch.
    assert engine_decode_batch(cfg) == 3 * engine_decode_batch(load_config(list(SEPARATE)))
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.rollout.async_training' must be a bool.*got 'yes'"):
        load_config([*SEPARATE, "actor_rollout_ref.rollout.async_training=yes"])


@pytest.mark.parametrize("async_key", [
    "actor_rollout_ref.rollout.max_staleness=2",
    "actor_rollout_ref.rollout.stale_groups=drop",
    "actor_rollout_ref.rollout.partial_rollout=abort",
])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_old_spelling_fails_in_one_line_naming_the_new_key(async_key, mode):
    with pytest.raises(ConfigError) as error:
        load_config([*SEPARATE, f"actor_rollout_ref.rollout.mode={mode}", async_key])
    lines = str(error.value).splitlines()
    assert len(lines) == 1, lines
    assert async_key.split(".")[-1].split("=")[0] in lines[0] and NEW_KEY in lines[0]
    load_config([*SEPARATE, f"actor_rollout_ref.rollout.mode={mode}", async_key, NEW_KEY])  # what it asks for works


def test_all_old_async_keys_come_in_the_same_one_line():
    keys = ["actor_rollout_ref.rollout.max_staleness=4", "actor_rollout_ref.rollout.stale_groups=regenerate"]
    with pytest.raises(ConfigError) as error:
        load_config([*SEPARATE, "actor_rollout_ref.rollout.mode=async", *keys])
    lines = str(error.value).splitlines()
    assert len(lines) == 1 and "max_staleness=4" in lines[0] and "stale_groups='regenerate'" in lines[0]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_setting_the_mode_says_once_that_it_changes_nothing(capsys, mode):
    load_config([f"actor_rollout_ref.rollout.mode={mode}"])
    notes = [line for line in capsys.readouterr().err.splitlines() if "rollout.mode" in line]
    assert len(notes) == 1
    assert notes[0].startswith(f"note: actor_rollout_ref.rollout.mode={mode} changes nothing here")
    assert "rollout.async_training=true" in notes[0]  # where fully asynchronous training went
    load_config([])
    assert "rollout.mode" not in capsys.readouterr().err  # a run that does not set it is not told


def test_images_refuse_async_training_not_verls_mode():
    from trainer.image_checks import unsupported_with_images

    assert not any("async" in p for p in unsupported_with_images(load_config(list(SEPARATE))))  # mode=async
    problems = unsupported_with_images(load_config([*SEPARATE, NEW_KEY]))
    assert any(p.startswith(NEW_KEY) for p in problems), problems
