"""Online DPO as a plain loop over worker groups.

    python -m recipes.online_dpo [hydra overrides]        # or: python -m trainer.main recipe=online_dpo ...

Each step:
  1. the actor samples `rollout.n` responses per prompt with its current weights;
  2. a verifier scores them (the rule reward, or a reward-model worker group when reward_model.enable);
  3. best vs worst response of each prompt form a pair (prompts whose responses tie are dropped and counted);
  4. the frozen reference policy gives the log-probs of the chosen and the rejected responses;
  5. the actor takes a DPO step (dpo.loss_type sigmoid | ipo | hinge, dpo.beta, dpo.label_smoothing).
With the default HF engine the generator IS the actor worker, so the new weights reach it with no copy;
with `rollout.name=vllm`, the run's rollout source (`step_rollout`) syncs them into the engine first. Config:
trainer/config/recipe/online_dpo.yaml.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np
from omegaconf import DictConfig

from protocol import DataProto
from recipes.config import as_dict, load_recipe_config
from recipes.pair_batch import pack_pairs, pad_for_ranks, sequence_log_probs
from trainer.algorithms.pairs import form_pairs
from trainer.cli import run_cli
from trainer.launch import run_loop
from trainer.role_groups import RoleGroups
from trainer.step_loop import StepLoop
from trainer.timing import PhaseTimer


class OnlineDPO(StepLoop):
    """The trainer's step loop (resume, validation, checkpoints, tracking) with the DPO step below."""

    progress_desc = "online dpo"

    def train_step(self, batch: DataProto) -> dict[str, float]:
        timer, actor = PhaseTimer(), self.roles.actor
        # 1. sample with the actor's current weights (with rollout.staleness=1: those of the step before)
        rollout = self.step_rollout(batch, timer)
        with timer("verify"):  # 2. score; the rule reward is also the task reward we report
            task_reward, reward_metrics = self.data.reward_fn(rollout)
            task_reward = task_reward.sum(-1)
            rm = self.roles.reward_model
            scores = rm.compute_rm_score(rollout).batch["rm_scores"].sum(-1) if rm is not None else task_reward
        chosen, rejected, dropped = form_pairs(scores, rollout.non_tensor_batch["uid"])  # 3. best vs worst
        metrics = {
            "reward/mean": float(task_reward.mean()), "reward/max": float(task_reward.max()),
            "reward/min": float(task_reward.min()),
            **{f"reward/{k}": v for k, v in reward_metrics.items()},
            "pairs/formed": len(chosen), "pairs/dropped": dropped,
            "response/length_mean": float(rollout.batch["response_mask"].sum(-1).float().mean()),
            **self.rollouts.metrics(rollout),
        }
        if rm is not None:
            metrics["reward/verifier_mean"] = float(scores.mean())
        if len(chosen):
            with timer("ref_log_prob"):  # 4. reference log-probs of both sides, one call
                both = rollout[np.concatenate([chosen, rejected])]
                ref = sequence_log_probs(
                    actor.compute_ref_log_prob(both).batch["ref_log_prob"], both.batch["response_mask"]
                )
                pairs = pack_pairs(rollout, chosen, rejected)
                pairs.batch["chosen_ref_logps"] = ref[: len(chosen)]
                pairs.batch["rejected_ref_logps"] = ref[len(chosen) :]
            with timer("update_actor"):  # 5. DPO step; the generator is this same model
                pairs = pad_for_ranks(pairs, actor.world_size)
                settings = as_dict(self.cfg.dpo)
                per_prompt = settings.pop("normalize_by") == "prompts"  # dropped prompts count as zero loss
                pairs.meta_info["dpo"] = {**settings, "loss_denominator": len(batch) if per_prompt else None}
                metrics.update({f"dpo/{k}": v for k, v in actor.update_actor_dpo(pairs)[0].items()})
        return {**metrics, **timer.metrics(), "timing/step_s": sum(timer.seconds.values())}

    def progress_postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {**super().progress_postfix(metrics), "acc": f"{metrics.get('dpo/accuracy', float('nan')):.2f}"}


def build_roles(cfg: DictConfig) -> RoleGroups:
    """The actor (generator, policy and frozen reference in one worker) and the optional reward model."""
    return RoleGroups.build(cfg, reference=True, critic=False)


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Build data, worker groups and tracker from `cfg`, then train; returns the metric history."""
    return run_loop(cfg, build_roles, OnlineDPO)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(sys.argv[1:] if argv is None else argv, lambda args: load_recipe_config("online_dpo", args), run)


if __name__ == "__main__":
    sys.exit(main())
