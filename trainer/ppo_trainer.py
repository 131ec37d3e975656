"""The PPO-family driver loop: generate → reward → log-probs/values → advantages → update, as plain code."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from omegaconf import DictConfig
from tqdm import tqdm

from protocol import DataProto
from single_controller.errors import WorkerGroupError
from trainer import checkpointing
from trainer.advantage import compute_advantage, token_level_rewards
from trainer.algorithms import make_kl_controller, masked_mean
from trainer.role_groups import RoleGroups
from trainer.timing import PhaseTimer
from trainer.tracking import Tracker

RewardFn = Callable[[DataProto], tuple[Any, dict[str, float]]]


def mean_metrics(per_worker: list[dict[str, float]], prefix: str) -> dict[str, float]:
    keys = per_worker[0].keys() if per_worker else []
    return {f"{prefix}/{k}": float(np.mean([m[k] for m in per_worker])) for k in keys}


class PPOTrainer:
    """Runs the configured algorithm over worker groups; every phase is one line in `train_step`."""

    def __init__(self, cfg: DictConfig, roles: RoleGroups, train_loader: Any, val_batches: list[DataProto], reward_fn: RewardFn, tracker: Tracker) -> None:
        self.cfg, self.algo = cfg, cfg.algorithm
        self.roles, self.train_loader, self.val_batches = roles, train_loader, val_batches
        self.reward_fn, self.tracker = reward_fn, tracker
        kl = self.algo.kl_ctrl
        self.kl_ctrl = make_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
        self.global_step = 0
        self.checkpoint_root = Path(cfg.trainer.default_local_dir)

    # ---- one step --------------------------------------------------------------------------------------
    def train_step(self, batch: DataProto) -> dict[str, float]:
        timer, n, actor = PhaseTimer(), self.cfg.actor_rollout_ref.rollout.n, self.roles.actor
        batch = batch.union(DataProto.from_dict(non_tensors={"uid": np.array([f"{self.global_step}-{i}" for i in range(len(batch))], dtype=object)}))
        rollout = batch.repeat(n, interleave=True)
        rollout.meta_info.update(seed=self.cfg.trainer.seed * 100_003 + self.global_step)  # reproducible sampling
        with timer("generate"):
            rollout = actor.generate_sequences(rollout)
        if self.algo.adv_estimator == "remax":
            with timer("generate_baseline"):
                rollout = self._add_greedy_baseline(batch, rollout, n)
        with timer("reward"):
            scores, reward_metrics = self.reward_fn(rollout)
            if self.roles.reward_model is not None:
                rm_scores = self.roles.reward_model.compute_rm_score(rollout).batch["rm_scores"]
                reward_metrics["reward_model_mean"] = float(rm_scores.sum(-1).mean())
                scores = scores + rm_scores
            rollout.batch["token_level_scores"] = scores
        with timer("old_log_prob"):
            rollout = rollout.union(actor.compute_log_prob(rollout))
        if self.roles.uses_reference:
            with timer("ref_log_prob"):
                rollout = rollout.union(actor.compute_ref_log_prob(rollout))
        if self.roles.critic is not None:
            with timer("values"):
                rollout = rollout.union(self.roles.critic.compute_values(rollout))
        with timer("advantage"):
            rollout.batch["token_level_rewards"], kl_metrics = token_level_rewards(rollout, self.algo, self.kl_ctrl)
            rollout.batch["advantages"], rollout.batch["returns"] = compute_advantage(rollout, self.algo)
        metrics: dict[str, float] = {}
        if self.roles.critic is not None:
            with timer("update_critic"):
                metrics.update(mean_metrics(self.roles.critic.update_critic(rollout), "critic"))
        with timer("update_actor"):
            metrics.update(mean_metrics(actor.update_actor(rollout), "actor"))
        metrics.update(self._batch_metrics(rollout, reward_metrics, kl_metrics, timer))
        return metrics

    def _add_greedy_baseline(self, batch: DataProto, rollout: DataProto, n: int) -> DataProto:
        greedy = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"], non_tensor_batch_keys=list(batch.non_tensor_batch))
        greedy.meta_info.update(do_sample=False)
        greedy = self.roles.actor.generate_sequences(greedy)
        baseline, _ = self.reward_fn(greedy)
        rollout.batch["reward_baselines"] = baseline.sum(-1).repeat_interleave(n)
        return rollout

    def _batch_metrics(self, rollout: DataProto, reward_metrics: dict, kl_metrics: dict, timer: PhaseTimer) -> dict[str, float]:
        mask = rollout.batch["response_mask"]
        scores = rollout.batch["token_level_scores"].sum(-1)
        tokens = int(rollout.batch["attention_mask"].sum())
        step_s = sum(timer.seconds.values())
        return {
            "reward/mean": float(scores.mean()),
            "reward/max": float(scores.max()),
            "reward/min": float(scores.min()),
            **{f"reward/{k}": v for k, v in reward_metrics.items()},
            **kl_metrics,
            "advantage/mean": float(masked_mean(rollout.batch["advantages"], mask)),
            "response/length_mean": float(mask.sum(-1).float().mean()),
            "perf/tokens": tokens,
            "perf/tokens_per_s": tokens / step_s if step_s else 0.0,
            "timing/step_s": step_s,
            **timer.metrics(),
        }

    # ---- validation ------------------------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        scores, sources = [], []
        for batch in self.val_batches:
            batch = batch.select(batch_keys=["input_ids", "attention_mask", "position_ids"], non_tensor_batch_keys=list(batch.non_tensor_batch))
            batch.meta_info.update(do_sample=False)
            out = self.roles.actor.generate_sequences(batch)
            score, _ = self.reward_fn(out)
            scores.append(score.sum(-1))
            sources.extend(out.non_tensor_batch["data_source"])
        if not scores:
            return {}
        all_scores = np.concatenate([s.numpy() for s in scores])
        metrics = {"val/reward_mean": float(all_scores.mean())}
        for source in sorted(set(sources)):
            metrics[f"val/{source}/reward_mean"] = float(all_scores[np.array(sources) == source].mean())
        return metrics

    # ---- checkpoints -----------------------------------------------------------------------------------
    def save(self) -> Path:
        state = {"global_step": self.global_step, "dataloader": self.train_loader.state_dict(), "kl_coef": self.kl_ctrl.value}
        return checkpointing.save_checkpoint(self.checkpoint_root, self.global_step, state, self.roles.save, self.cfg.trainer.max_ckpt_to_keep)

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
        self.train_loader.load_state_dict(state["dataloader"])
        self.kl_ctrl.value = state["kl_coef"]
        self.global_step = state["global_step"]
        print(f"resumed from {path} at step {self.global_step}")

    # ---- the run ---------------------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        cfg = self.cfg.trainer
        self.maybe_resume()
        if cfg.val_before_train and self.global_step == 0 and self.val_batches:
            self.tracker.log(self.validate(), step=0)
        batches = iter(self.train_loader)
        progress = tqdm(total=cfg.total_training_steps, initial=self.global_step, desc="training", unit="step")
        while self.global_step < cfg.total_training_steps:
            start = time.perf_counter()
            batch = next(batches)
            metrics = self.train_step(batch)
            self.global_step += 1
            if cfg.test_freq > 0 and self.global_step % cfg.test_freq == 0 and self.val_batches:
                metrics.update(self.validate())
            if cfg.save_freq > 0 and self.global_step % cfg.save_freq == 0:
                self.save()
            metrics["timing/wall_step_s"] = time.perf_counter() - start
            self.tracker.log(metrics, step=self.global_step)
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
        progress.close()
        if cfg.save_at_end and (cfg.save_freq <= 0 or self.global_step % cfg.save_freq):
            self.save()
        return self.tracker.history
