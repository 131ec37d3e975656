"""My recipe: a policy-gradient loop of my own, written outside the toolkit (docs/recipes.md walks through it).

    python my_recipe.py [overrides]                              # from this folder
    python -m trainer.main recipe=path/to/my_recipe [overrides]  # from anywhere
    ray job submit --working-dir . -- python my_recipe.py [overrides]

Each step samples `rollout.n` responses per prompt, scores them, drops the prompts whose samples all
scored alike, and takes a policy-gradient step on the others with each response's score minus its
prompt's mean (group_filter.py, a module of this folder). Config: my_recipe.yaml (defaults over the
trainer's config) and FilterConfig (the typed `group_filter` section).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from group_filter import group_advantages
from protocol import DataProto
from trainer.launch import run_loop
from trainer.recipe_runner import recipe_main
from trainer.role_groups import RoleGroups
from trainer.step_loop import StepLoop
from trainer.timing import PhaseTimer


@dataclass
class FilterConfig:
    min_spread: float = 0.0  # keep a prompt when its best and worst scores differ by more than this
    scale_by_std: bool = False  # divide the centred scores by the prompt's std (GRPO-style)


CONFIG_SECTIONS = {"group_filter": FilterConfig}


class FilteredPolicyGradient(StepLoop):
    progress_desc = "my recipe"

    def train_step(self, batch: DataProto) -> dict[str, float]:
        timer, actor, n, settings = PhaseTimer(), self.roles.actor, self.cfg.actor_rollout_ref.rollout.n, self.cfg.group_filter
        # Synced to the actor's weights, then generated: a uid per prompt, n copies of each, a sampling seed
        rollout = self.step_rollout(batch, timer)
        with timer("reward"):
            scores = self.data.reward_fn(rollout)[0].sum(-1)
        advantages, kept = group_advantages(scores, rollout.non_tensor_batch["uid"], settings.min_spread, settings.scale_by_std)
        metrics = {"reward/mean": float(scores.mean()), "filter/kept_prompts": len(kept) // n}
        if len(kept):
            rollout = rollout[kept]
            rollout.batch["advantages"] = advantages[kept][:, None] * rollout.batch["response_mask"]
            with timer("old_log_prob"):
                rollout = rollout.union(actor.compute_log_prob(rollout))
            with timer("update_actor"):
                metrics.update({f"actor/{k}": v for k, v in actor.update_actor(rollout)[0].items()})
        return {**metrics, **timer.metrics()}


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    return run_loop(cfg, lambda c: RoleGroups.build(c, reference=False, critic=False), FilteredPolicyGradient)


if __name__ == "__main__":
    sys.exit(recipe_main(__name__))
