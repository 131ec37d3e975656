"""Online DPO as a plain loop over worker groups.

    python -m recipes.online_dpo [hydra overrides]        # or: python -m trainer.main recipe=online_dpo ...

Each step:
  1. the actor samples `rollout.n` responses per prompt with its current weights;
  2. a verifier scores them (the rule reward, or a reward-model worker group when reward.reward_model.enable);
  3. best vs worst response of each prompt form a pair (prompts whose responses tie are dropped and counted);
  4. the frozen reference policy gives the log-probs of the chosen and the rejected responses;
  5. the actor takes a DPO step (dpo.loss_type sigmoid | ipo | hinge, dpo.beta, dpo.label_smoothing).
The generator IS the actor worker (HF generate on the FSDP model), so the new weights reach the generator
with no copy: the next step samples from the updated policy. Config: trainer/config/recipe/online_dpo.yaml.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from protocol import DataProto
from recipes.config import ConfigError, as_dict, load_recipe_config
from recipes.data import RunData, build_run_data
from recipes.evaluation import validate
from recipes.groups import PreferenceGroups
from recipes.pair_batch import pack_pairs, pad_for_ranks, sequence_log_probs
from trainer import checkpointing
from trainer.algorithms.pairs import form_pairs
from trainer.main import ensure_default_assets, init_ray
from trainer.timing import PhaseTimer
from trainer.tracking import Tracker


class OnlineDPO:
    def __init__(self, cfg: DictConfig, groups: PreferenceGroups, data: RunData, tracker: Tracker) -> None:
        self.cfg, self.groups, self.data, self.tracker = cfg, groups, data, tracker
        self.global_step = 0

    def train_step(self, batch: DataProto) -> dict[str, float]:
        timer, actor, n = PhaseTimer(), self.groups.actor, self.cfg.actor_rollout_ref.rollout.n
        uids = np.array([f"{self.global_step}-{i}" for i in range(len(batch))], dtype=object)
        rollout = batch.union(DataProto.from_dict(non_tensors={"uid": uids})).repeat(n, interleave=True)
        rollout.meta_info.update(seed=self.cfg.trainer.seed * 100_003 + self.global_step)  # reproducible sampling
        with timer("generate"):  # 1. sample with the actor's current weights
            rollout = actor.generate_sequences(rollout)
        with timer("verify"):  # 2. score; the rule reward is also the task reward we report
            task_reward, reward_metrics = self.data.reward_fn(rollout)
            task_reward = task_reward.sum(-1)
            rm = self.groups.reward_model
            scores = rm.compute_rm_score(rollout).batch["rm_scores"].sum(-1) if rm is not None else task_reward
        chosen, rejected, dropped = form_pairs(scores, rollout.non_tensor_batch["uid"])  # 3. best vs worst
        metrics = {
            "reward/mean": float(task_reward.mean()), "reward/max": float(task_reward.max()), "reward/min": float(task_reward.min()),
            **{f"reward/{k}": v for k, v in reward_metrics.items()},
            "pairs/formed": len(chosen), "pairs/dropped": dropped,
            "response/length_mean": float(rollout.batch["response_mask"].sum(-1).float().mean()),
        }
        if rm is not None:
            metrics["reward/verifier_mean"] = float(scores.mean())
        if len(chosen):
            with timer("ref_log_prob"):  # 4. reference log-probs of both sides, one call
                both = rollout[np.concatenate([chosen, rejected])]
                ref = sequence_log_probs(actor.compute_ref_log_prob(both).batch["ref_log_prob"], both.batch["response_mask"])
                pairs = pack_pairs(rollout, chosen, rejected)
                pairs.batch["chosen_ref_logps"], pairs.batch["rejected_ref_logps"] = ref[: len(chosen)], ref[len(chosen) :]
            with timer("update_actor"):  # 5. DPO step; the generator is this same model
                pairs = pad_for_ranks(pairs, actor.world_size)
                settings = as_dict(self.cfg.dpo)
                per_prompt = settings.pop("normalize_by") == "prompts"  # dropped prompts count as zero loss
                pairs.meta_info["dpo"] = {**settings, "loss_denominator": len(batch) if per_prompt else None}
                metrics.update({f"dpo/{k}": v for k, v in actor.update_actor_dpo(pairs)[0].items()})
        return {**metrics, **timer.metrics(), "timing/step_s": sum(timer.seconds.values())}

    # ---- checkpoints: the trainer's folder layout and atomic save ---------------------------------------
    def save(self) -> Path:
        state = {"global_step": self.global_step, "dataloader": self.data.train_loader.state_dict()}
        root, keep = Path(self.cfg.trainer.default_local_dir), self.cfg.trainer.get("max_ckpt_to_keep")
        return checkpointing.save_checkpoint(root, self.global_step, state, self.groups.save, keep)

    def maybe_resume(self) -> None:
        path = checkpointing.find_resume_dir(Path(self.cfg.trainer.default_local_dir), str(self.cfg.trainer.resume_mode))
        if path is not None:
            state = checkpointing.load_driver_state(path)
            self.groups.load(path)
            self.data.train_loader.load_state_dict(state["dataloader"])
            self.global_step = state["global_step"]
            print(f"resumed from {path} at step {self.global_step}")

    def fit(self) -> list[dict[str, Any]]:
        cfg, actor = self.cfg.trainer, self.groups.actor
        self.maybe_resume()
        if cfg.val_before_train and self.global_step == 0 and self.data.val_batches:
            self.tracker.log(validate(actor, self.data.val_batches, self.data.reward_fn), step=0)
        batches = iter(self.data.train_loader)
        progress = tqdm(total=cfg.total_training_steps, initial=self.global_step, desc="online dpo", unit="step")
        while self.global_step < cfg.total_training_steps:
            start = time.perf_counter()
            metrics = self.train_step(next(batches))
            self.global_step += 1
            if cfg.test_freq > 0 and self.global_step % cfg.test_freq == 0 and self.data.val_batches:
                metrics.update(validate(actor, self.data.val_batches, self.data.reward_fn))
            if cfg.save_freq > 0 and self.global_step % cfg.save_freq == 0:
                self.save()
            metrics["timing/wall_step_s"] = time.perf_counter() - start
            self.tracker.log(metrics, step=self.global_step)
            progress.update(1)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics.get('dpo/accuracy', float('nan')):.2f}")
        progress.close()
        if cfg.save_at_end and (cfg.save_freq <= 0 or self.global_step % cfg.save_freq):
            self.save()
        return self.tracker.history


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Build data, worker groups and tracker from `cfg`, then train; returns the metric history."""
    ensure_default_assets(cfg)
    init_ray(cfg)
    data = build_run_data(cfg)
    log_dir = Path(cfg.trainer.default_local_dir) / "logs"
    tracker = Tracker(cfg.trainer.logger, log_dir)
    groups = PreferenceGroups.build(cfg)
    try:
        history = OnlineDPO(cfg, groups, data, tracker).fit()
        curve = tracker.plot_reward_curve(log_dir / "reward_curve.png")
        if curve:
            print(f"reward curve: {curve}")
        if cfg.trainer.export_hf_at_end:
            groups.actor.export_hf(str(Path(cfg.trainer.default_local_dir) / "hf_export"))
    finally:
        tracker.close()
        groups.shutdown()
    return history


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    print_cfg = "--cfg" in args  # `--cfg job`: print the resolved config and exit, as trainer.main does
    if print_cfg:
        del args[args.index("--cfg") : args.index("--cfg") + 2]
    try:
        cfg = load_recipe_config("online_dpo", args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if print_cfg:
        print(OmegaConf.to_yaml(cfg))
        return 0
    run(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
