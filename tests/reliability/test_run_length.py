"""The step count of a run without `trainer.total_training_steps` comes from the loaded data (verl's rule: batches
per epoch x `trainer.total_epochs`), after `data.filter_overlong_prompts` dropped what it drops, and the
"nothing to train" check of a resumed run reads that count. No worker starts (`no_ray`)."""

from __future__ import annotations

import pytest

from tests.reliability.conftest import short_run
from trainer import checkpointing
from trainer.config_loader import load_config
from trainer.data import RLDataset
from trainer.main import main
from trainer.preflight import load_tokenizer
from trainer.run_data import build_run_data
from trainer.step_count import resolve_training_steps

UNSET = "trainer.total_training_steps=null"
PROMPTS = 64  # small_assets' training prompts


def _resolved(assets, tmp_path, *overrides: str) -> tuple[int, object]:
    cfg = load_config(short_run(assets, tmp_path, UNSET, *overrides))
    data = build_run_data(cfg)
    return resolve_training_steps(cfg, len(data.train_loader)), data


@pytest.mark.parametrize(("overrides", "batch", "epochs"), [
    ((), 16, 1),
    (("trainer.total_epochs=3",), 16, 3),
    (("data.train_batch_size=24", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.total_epochs=2"), 24, 2),
    # DAPO's dynamic sampling: the dataloader draws generation batches of data.gen_batch_size
    (("algorithm=dapo", "data.gen_batch_size=32", "trainer.total_epochs=5"), 32, 5),
])
def test_the_step_count_is_batches_per_epoch_times_epochs(small_assets, tmp_path, overrides, batch, epochs):
    steps, data = _resolved(small_assets, tmp_path, *overrides)
    assert data.prompt_counts["data/prompts"] == PROMPTS
    assert steps == (PROMPTS // batch) * epochs


def test_filtered_prompts_shorten_the_epoch_and_val_files_are_filtered_too(small_assets, tmp_path, capsys):
    tokenizer = load_tokenizer(small_assets["model"])
    lengths = {name: sorted(len(ids) for ids in RLDataset(small_assets[name], tokenizer, 512)._input_ids)
               for name in ("train", "val")}
    limit = lengths["train"][PROMPTS // 2]  # about half of the prompts fit
    long_train = sum(n > limit for n in lengths["train"])
    long_val = sum(n > limit for n in lengths["val"])
    assert 16 <= PROMPTS - long_train < PROMPTS and long_val > 0
    steps, data = _resolved(
        small_assets, tmp_path, f"data.max_prompt_length={limit}", "data.truncation=error",  # never fires
        "data.filter_overlong_prompts=true", f"data.val_files={small_assets['val']}", "trainer.total_epochs=2",
    )
    assert data.prompt_counts["data/filtered_prompts"] == long_train
    assert steps == (PROMPTS - long_train) // 16 * 2
    assert sum(len(batch) for batch in data.val_batches) == len(lengths["val"]) - long_val
    out = capsys.readouterr().out
    assert f"{long_train} filtered, 0 truncated (data.filter_overlong_prompts=true)" in out
    assert f"data: {long_val} validation prompts longer than max_prompt_length={limit} dropped" in out


def test_a_resumed_run_at_the_resolved_last_step_has_nothing_to_train(no_ray, small_assets, tmp_path, capsys):
    last = PROMPTS // 16  # one epoch of small_assets
    checkpointing.save_checkpoint(tmp_path, last, {"global_step": last, "dataloader": {}}, lambda folder: None)
    assert main(short_run(small_assets, tmp_path, UNSET)) == 0
    err = capsys.readouterr().err
    assert f"is at step {last} and trainer.total_training_steps={last}" in err
    # Two epochs leave steps to train: the run goes on to start Ray (which no_ray forbids here).
    with pytest.raises(AssertionError, match="Ray was started"):
        main(short_run(small_assets, tmp_path, UNSET, "trainer.total_epochs=2"))
