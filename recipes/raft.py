"""RAFT (reward-ranked fine-tuning): rejection sampling, then a supervised step on what was kept.

    python -m recipes.raft [hydra overrides]            # or: python -m trainer.main recipe=raft ...

Each step:
  1. the actor samples `rollout.n` responses per prompt with its current weights;
  2. the rule reward scores them;
  3. per prompt, the best response is kept when it scores at least `raft.min_reward`;
  4. the actor takes an SFT step (token NLL) on the kept responses: `update_actor_sft`.
Config: raft.yaml next to this file (trainer defaults) and `RaftConfig` (the typed `raft` section).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from protocol import DataProto
from recipes.sft_batch import sft_batch
from trainer.algorithms.selection import best_per_prompt
from trainer.launch import run_loop
from trainer.ppo_trainer import mean_metrics
from trainer.recipe_runner import recipe_main
from trainer.role_groups import RoleGroups
from trainer.step_loop import StepLoop
from trainer.timing import PhaseTimer


@dataclass
class RaftConfig:
    min_reward: float = 0.25  # a prompt's best response is trained on only when it scores at least this


CONFIG_SECTIONS = {"raft": RaftConfig}


class RAFT(StepLoop):
    """The trainer's step loop (resume, validation, checkpoints, tracking) with the RAFT step below."""

    progress_desc = "raft"

    def train_step(self, batch: DataProto) -> dict[str, float]:
        timer, actor = PhaseTimer(), self.roles.actor
        # 1. sample with the actor's current weights (the step's weight sync, then generate: as every loop)
        rollout = self.step_rollout(batch, timer)
        with timer("reward"):  # 2. score
            scores, reward_metrics = self.data.reward_fn(rollout)
            scores = scores.sum(-1)
        kept, left_out = best_per_prompt(scores, rollout.non_tensor_batch["uid"], self.cfg.raft.min_reward)  # 3. select
        metrics = {
            "reward/mean": float(scores.mean()), "reward/max": float(scores.max()), "reward/min": float(scores.min()),
            **{f"reward/{k}": v for k, v in reward_metrics.items()},
            "raft/kept": len(kept), "raft/left_out": left_out,
            "raft/kept_reward_mean": float(scores[kept].mean()) if len(kept) else float("nan"),
            "response/length_mean": float(rollout.batch["response_mask"].sum(-1).float().mean()),
        }
        if len(kept):
            with timer("update_actor"):  # 4. supervised step on the kept responses
                sft = sft_batch(rollout, kept, actor.world_size)
                # averaged over the ranks that report
                metrics.update(mean_metrics(actor.update_actor_sft(sft), "actor"))
        return {**metrics, **timer.metrics(), "timing/step_s": sum(timer.seconds.values())}


def build_roles(cfg: DictConfig) -> RoleGroups:
    """The actor only: it generates and trains; SFT needs no reference model or critic."""
    return RoleGroups.build(cfg, reference=False, critic=False)


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Build data, worker groups and tracker from `cfg`, then train; returns the metric history."""
    return run_loop(cfg, build_roles, RAFT)


if __name__ == "__main__":
    sys.exit(recipe_main(__name__))
