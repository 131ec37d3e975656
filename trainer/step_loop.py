"""What every RL loop shares: resume, the step loop with validation and checkpoints, tracking, a progress bar.

A recipe subclasses `StepLoop` and writes only `train_step` (its algorithm, one line per phase); the rest
(the trainer's checkpoint layout, `trainer.*` schedule keys, metrics to the tracker) is the same for all.
`step_rollout(batch, timer)` gives the step's responses (trainer loop and recipes alike) and
`rollout_source.generate_sequences(prompts, timer)` generates any other batch: both sync the engines first
(trainer/rollout_source.py). `generation_input(batch)` readies the step's batch for generation; `draw_prompts()`
takes more prompts from the dataloader within a step (DAPO's dynamic sampling does), and checkpoints count them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig
from tqdm import tqdm

from protocol import DataProto
from single_controller.errors import WorkerGroupError
from trainer import checkpointing
from trainer.async_rollout import AsyncRollout
from trainer.resume_checks import RECORD_KEY, resume_record
from trainer.rollout_pipeline import LookaheadBatches, RolloutPipeline, prompts_for_step
from trainer.rollout_source import RolloutSource
from trainer.run_data import RunData
from trainer.step_count import resolve_training_steps
from trainer.timing import PhaseTimer
from trainer.tracking import Tracker
from trainer.validation import ValSampling, validate


class StepLoop:
    """Subclasses set `progress_desc` and implement `train_step(batch) -> metrics`."""

    progress_desc = "training"

    def __init__(self, cfg: DictConfig, roles: Any, data: RunData, tracker: Tracker) -> None:
        self.cfg, self.roles, self.data, self.tracker = cfg, roles, data, tracker
        if cfg.trainer.get("total_training_steps") is None:  # a loop built without run_loop, which resolves it
            resolve_training_steps(cfg, len(data.train_loader))
        self.global_step = 0
        self.checkpoint_root = Path(cfg.trainer.default_local_dir)
        # Set by the launcher (trainer.on_node_join=grow): asked after each periodic checkpoint; True ends fit()
        # there, with `stopped_at_checkpoint` set, so that the run goes on from that checkpoint on more nodes.
        self.stop_at_checkpoint: Callable[[], bool] | None = None
        self.stopped_at_checkpoint = False
        self.batches: LookaheadBatches | AsyncRollout | None = None  # the batch source, while fit() runs
        rollout = cfg.actor_rollout_ref.rollout
        self.draws_in_step = 0  # batches taken from the dataloader in this step (its own batch included)
        # Every generation of the run goes through it: the step's, any drawn on top, validation's.
        self.rollout_source: RolloutSource = roles.rollout_source
        self.rollouts: RolloutPipeline | AsyncRollout = (
            AsyncRollout(self.rollout_source, cfg) if rollout.get("async_training", False)
            else RolloutPipeline(self.rollout_source, rollout.get("staleness", 0))
        )

    def train_step(self, batch: DataProto) -> dict[str, float]:
        raise NotImplementedError

    def validate(self) -> dict[str, float]:
        """The actor's responses on the validation set (sampled as `rollout.val_kwargs` says: greedy by default),
        scored by the run's reward manager; `trainer.log_val_generations` samples go to the trackers."""
        shown = int(self.cfg.trainer.get("log_val_generations", 0) or 0)
        result = validate(
            self.rollout_source, self.data.val_batches, self.data.reward_fn,
            ValSampling.from_config(self.cfg.actor_rollout_ref.rollout.get("val_kwargs")),
            tokenizer=self.data.tokenizer, log_generations=shown, seed=self.cfg.trainer.seed, step=self.global_step,
        )
        if result.generations:
            self.tracker.log_generations(result.generations, step=self.global_step)
        return result.metrics

    # ---- checkpoints: extra driver state is a hook --------------------------------------------------------
    def driver_state(self) -> dict[str, Any]:
        return {}

    def restore_driver_state(self, state: dict[str, Any]) -> None:
        return None

    # ---- prompts and rollouts -----------------------------------------------------------------------------
    def generation_input(self, batch: DataProto, draw: int = 0) -> DataProto:
        """`batch` ready for `generate_sequences`: a uid per prompt (unique in the run), `rollout.n` copies of
        each prompt (a prompt's copies adjacent), and a sampling seed of its own. `draw` numbers the batches
        of one step: 0 for the batch `train_step` was given, 1, 2, ... for those of `draw_prompts()`."""
        rollout = self.cfg.actor_rollout_ref.rollout
        return prompts_for_step(batch, self.global_step, rollout.n, self.cfg.trainer.seed, draw)

    def draw_prompts(self) -> DataProto:
        """The next batch of prompts from the dataloader, on top of the step's own, as `generation_input`
        gives it (new uids, a new seed). Checkpoints record the dataloader after every batch drawn, so a
        resumed run goes on with the prompts that follow them."""
        if self.batches is None:
            raise RuntimeError(
                "draw_prompts() takes prompts from the dataloader of a running fit(): call it in train_step"
            )
        if isinstance(self.rollouts, AsyncRollout):
            raise RuntimeError(
                "draw_prompts() needs actor_rollout_ref.rollout.async_training=false: with async_training=true the "
                "engines take their prompts "
                "from the dataloader themselves and each step trains on whatever groups finished"
            )
        if self.rollouts.staleness:
            raise RuntimeError(
                "draw_prompts() needs actor_rollout_ref.rollout.staleness=0: with staleness 1 the next step's batch is "
                "already being generated, so prompts drawn now would come out of order"
            )
        batch = self.batches.next()
        self.draws_in_step += 1
        return self.generation_input(batch, draw=self.draws_in_step - 1)

    def step_rollout(self, batch: DataProto, timer: PhaseTimer) -> DataProto:
        """This step's responses to `batch` (`rollout.n` per prompt, a uid per prompt) after the step's weight
        sync: generated now, or with rollout.staleness=1 during the previous step (see
        trainer/rollout_pipeline.py), or with rollout.async_training=true taken from the engines' stream,
        `batch` being their prompts (trainer/async_rollout.py). Phases: `sync_weights`, then `generate` (or
        `wait_rollout`, `start_generate`)."""
        if isinstance(self.rollouts, AsyncRollout):
            return self.rollouts.rollout(timer)
        n, seed = self.cfg.actor_rollout_ref.rollout.n, self.cfg.trainer.seed

        def upcoming() -> DataProto | None:
            if self.batches is None or self.global_step + 1 >= self.cfg.trainer.total_training_steps:
                return None
            return prompts_for_step(self.batches.peek(), self.global_step + 1, n, seed)

        return self.rollouts.rollout(self.generation_input(batch), upcoming, timer)

    def save(self) -> Path:
        # The position before a batch taken ahead (in flight): a resumed run generates it again.
        loader_state = self.batches.state_dict() if self.batches is not None else self.data.train_loader.state_dict()
        state = {
            "global_step": self.global_step,
            "dataloader": loader_state,
            **self.rollouts.checkpoint_state(),
            **self.driver_state(),
        }
        state[RECORD_KEY] = resume_record(self.cfg)  # what a resumed run must match, checked before Ray starts
        return checkpointing.save_checkpoint(
            self.checkpoint_root, self.global_step, state, self.roles.save, self.cfg.trainer.max_ckpt_to_keep
        )

    def maybe_resume(self) -> None:
        path = checkpointing.find_resume_dir(self.checkpoint_root, str(self.cfg.trainer.resume_mode))
        if path is None:
            return
        state = checkpointing.load_driver_state(path)
        try:
            self.roles.load(path)
        except WorkerGroupError as error:
            if type(error) is not WorkerGroupError:  # a dead or stuck worker is not the checkpoint's fault
                raise
            # The manifest matched, yet a worker could not read its shard: name the folder.
            raise checkpointing.CheckpointError(f"could not load checkpoint {path}: {error}") from error
        self.data.train_loader.load_state_dict(state["dataloader"])
        self.rollouts.restore(state, path)
        self.restore_driver_state(state)
        self.global_step = state["global_step"]
        print(f"resumed from {path} at step {self.global_step}")

    # ---- the run ------------------------------------------------------------------------------------------
    def progress_postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics.get('reward/mean', float('nan')):.3f}"}

    def fit(self) -> list[dict[str, Any]]:
        cfg = self.cfg.trainer
        self.maybe_resume()
        if cfg.val_before_train and self.global_step == 0 and self.data.val_batches:
            self.tracker.log(self.validate(), step=0)
        self.batches = self.rollouts.batches(self.data.train_loader)
        progress = tqdm(total=cfg.total_training_steps, initial=self.global_step, desc=self.progress_desc, unit="step")
        try:
            while self.global_step < cfg.total_training_steps:
                start = time.perf_counter()
                self.draws_in_step = 1
                metrics = self.train_step(self.batches.next())
                self.global_step += 1
                if cfg.test_freq > 0 and self.global_step % cfg.test_freq == 0 and self.data.val_batches:
                    metrics.update(self.validate())
                saved = cfg.save_freq > 0 and self.global_step % cfg.save_freq == 0
                if saved:
                    self.save()
                metrics["timing/wall_step_s"] = time.perf_counter() - start
                self.tracker.log(metrics, step=self.global_step)
                progress.update(1)
                progress.set_postfix(self.progress_postfix(metrics))
                more_steps = self.global_step < cfg.total_training_steps
                if saved and more_steps and self.stop_at_checkpoint is not None and self.stop_at_checkpoint():
                    self.stopped_at_checkpoint = True
                    break
        finally:
            progress.close()  # on Ctrl-C too: the bar's line ends before the run's last message
        self.rollouts.close()  # async: the streams stop before the final save (their prompts stay open in it)
        if cfg.save_at_end and (cfg.save_freq <= 0 or self.global_step % cfg.save_freq):
            self.save()
        return self.tracker.history
