"""The recipe API for more prompts within a step (`StepLoop.draw_prompts`), driven by the real step loop with
driver-only roles: unique uids over steps and draws, and checkpoints that count every batch drawn."""

import pytest
import torch

from protocol import DataProto
from trainer import checkpointing
from trainer.config_loader import load_config
from trainer.data import make_dataloader
from trainer.run_data import RunData
from trainer.step_loop import StepLoop
from trainer.tracking import Tracker


class DriverOnlyRoles:
    """What StepLoop needs of the roles when train_step calls no worker: checkpoint hooks (no rollout source)."""

    rollout_source = None

    def save(self, folder) -> None:
        return None

    def load(self, folder) -> None:
        return None


class DrawingLoop(StepLoop):
    """Each step takes its own batch and draws `extra` more, recording the prompts and uids it saw."""

    extra = 2

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.seen: list[tuple[int, list[int], list[str]]] = []

    def train_step(self, batch: DataProto) -> dict[str, float]:
        inputs = [self.generation_input(batch)] + [self.draw_prompts() for _ in range(self.extra)]
        for prompts in inputs:
            self.seen.append((self.global_step, prompts.batch["prompt_id"].tolist(), prompts.non_tensor_batch["uid"].tolist()))
        return {"draws": float(self.draws_in_step)}


def _loop(tmp_path, steps: int, loop_class=DrawingLoop, *extra: str) -> StepLoop:
    cfg = load_config([
        f"trainer.default_local_dir={tmp_path}", f"trainer.total_training_steps={steps}", "trainer.save_freq=2",
        "actor_rollout_ref.rollout.n=2", "data.train_batch_size=8", "trainer.logger=[]", *extra,
    ])
    loader = make_dataloader([{"prompt_id": torch.tensor(i)} for i in range(80)], 8, shuffle=False)
    data = RunData(tokenizer=None, train_loader=loader, val_batches=[], reward_fn=None, prompt_counts={})
    return loop_class(cfg, DriverOnlyRoles(), data, Tracker([], tmp_path / "logs"))


def test_drawn_prompts_have_unique_uids_and_checkpoints_count_them(tmp_path):
    loop = _loop(tmp_path, 3)
    history = loop.fit()
    assert [r["draws"] for r in history] == [3.0, 3.0, 3.0]
    prompt_ids = [pid for _, ids, _ in loop.seen for pid in ids[::2]]
    assert prompt_ids == list(range(72))  # 3 steps x 3 batches of 8, in dataloader order, none twice
    uids = [uid for _, _, batch_uids in loop.seen for uid in batch_uids[::2]]
    assert len(set(uids)) == 72 and uids[8] == "0-1-0" and uids[-1] == "2-2-7"
    assert checkpointing.load_driver_state(tmp_path / "global_step_2")["dataloader"]["position"] == 6

    resumed = _loop(tmp_path, 4)
    resumed.fit()  # from the checkpoint at step 3 (save_at_end)
    assert resumed.seen[0][0] == 3 and resumed.seen[0][1][::2] == list(range(72, 80))  # the batch after the last drawn
    assert resumed.seen[1][1][::2] == list(range(8))  # the next epoch


def test_draw_prompts_outside_a_step_or_one_step_off_is_refused(tmp_path):
    loop = _loop(tmp_path, 1)
    with pytest.raises(RuntimeError, match="call it in train_step"):
        loop.draw_prompts()
    loop.batches, loop.rollouts.staleness = iter([]), 1
    with pytest.raises(RuntimeError, match="needs actor_rollout_ref.rollout.staleness=0"):
        loop.draw_prompts()
