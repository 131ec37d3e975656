"""The PPO-family driver loop: generate → reward → log-probs/values → advantages → update, as plain code."""

from __future__ import annotations

import sys
import time
from typing import Any

from omegaconf import DictConfig

from protocol import DataProto
from trainer.advantage import compute_advantage, token_level_rewards
from trainer.agent_metrics import agent_metrics
from trainer.algorithm_settings import gen_batch_size
from trainer.algorithms import make_kl_controller
from trainer.balance import balance_batch
from trainer.critic_warmup import actor_trains
from trainer.dynamic_sampling import ScoredRollout, fill_with_mixed_groups, rows_per_prompt
from trainer.old_log_prob_pass import old_log_prob_pass_needed
from trainer.overhead import reset_call_logs, step_overhead
from trainer.perf_metrics import RunPerf
from trainer.rewards.managers import task_scores
from trainer.role_groups import RoleGroups
from trainer.run_data import RunData
from trainer.step_loop import StepLoop
from trainer.timing import PhaseTimer
from trainer.tracking import Tracker
from trainer.worker_metrics import mean_over_workers
from workers.rl_math.masked import masked_mean
from workers.rl_math.rollout_correction import (
    OLD_LOG_PROBS,
    ROLLOUT_IS_WEIGHTS,
    ROLLOUT_LOG_PROBS,
    logprob_gap_metrics,
    truncated_is_weights,
)
from workers.routing_replay.token_order import without_routing_table


def mean_metrics(per_worker: list[dict[str, float]], prefix: str) -> dict[str, float]:
    """Each metric averaged over the workers that report it, named `prefix/name`; a name that already has its
    group (`rollout/logprob_gap_mean` from the update) keeps it."""
    return {k if "/" in k else f"{prefix}/{k}": value for k, value in mean_over_workers(per_worker).items()}


class PPOTrainer(StepLoop):
    """The configured PPO-family algorithm; every phase is one line in `train_step`. Resume, validation,
    checkpoints and tracking come from `StepLoop`."""

    def __init__(self, cfg: DictConfig, roles: RoleGroups, data: RunData, tracker: Tracker) -> None:
        super().__init__(cfg, roles, data, tracker)
        self.algo = cfg.algorithm
        kl = self.algo.kl_ctrl
        self.kl_ctrl = make_kl_controller(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)
        self.reward_fn = data.reward_fn
        self._warned_top_up = False
        self.perf = RunPerf.from_config(cfg)  # MFU per phase, tokens/s per GPU
        self.old_log_prob_pass = old_log_prob_pass_needed(cfg)

    # ---- one step --------------------------------------------------------------------------------------
    def train_step(self, batch: DataProto) -> dict[str, float]:
        reset_call_logs(self.roles)
        started = time.perf_counter()
        timer, actor = PhaseTimer(), self.roles.actor
        rollout = self.step_rollout(batch, timer)  # sync + generate (or the batch generated during the last step)
        staleness = self.rollouts.metrics(rollout)
        scored = self._score(batch, rollout, timer)  # rule reward (+ reward model, overlong penalty, ReMax baseline)
        filter_metrics: dict[str, float] = {}
        if self.algo.filter_groups.enable:  # DAPO: only groups whose responses differ, drawing more prompts
            scored, filter_metrics = self._keep_mixed_groups(scored, timer)
        rollout = scored.rollout
        if self.cfg.trainer.balance_batch:
            rollout = balance_batch(rollout, actor.world_size)
        is_metrics: dict[str, float] = {}
        if self.old_log_prob_pass:  # else the update's own forward gives pi_old (trainer/old_log_prob_pass.py)
            with timer("old_log_prob"):
                rollout = rollout.union(actor.compute_log_prob(rollout))
            is_metrics = self._importance_weights(rollout)
        if self.roles.uses_reference:
            with timer("ref_log_prob"):
                rollout = rollout.union(actor.compute_ref_log_prob(without_routing_table(rollout)))
        if self.roles.critic is not None:
            with timer("values"):
                rollout = rollout.union(self.roles.critic.compute_values(without_routing_table(rollout)))
        with timer("advantage"):
            rollout.batch["token_level_rewards"], kl_metrics = token_level_rewards(rollout, self.algo, self.kl_ctrl)
            rollout.batch["advantages"], rollout.batch["returns"] = compute_advantage(rollout, self.algo)
        metrics: dict[str, float] = {}
        if self.roles.critic is not None:
            with timer("update_critic"):
                metrics.update(mean_metrics(self.roles.critic.update_critic(without_routing_table(rollout)), "critic"))
        if self._actor_trains():
            with timer("update_actor"):
                metrics.update(mean_metrics(actor.update_actor(rollout), "actor"))
        if self.cfg.trainer.get("critic_warmup", 0) > 0:  # during the warmup: no actor/* losses, updated 0
            metrics["actor/updated"] = float(self._actor_trains())
        metrics.update(self._batch_metrics(rollout, scored.metrics, kl_metrics, timer))
        metrics.update({**staleness, **is_metrics, **filter_metrics})
        collecting = time.perf_counter()
        metrics.update(step_overhead(collecting - started, self.roles, scored.reward_fn_s + timer.seconds["advantage"]))
        metrics.update(self.roles.pop_worker_metrics())
        # After the step's phases: the calls that collect the workers' call timings and metrics.
        metrics["timing/worker_metrics_s"] = time.perf_counter() - collecting
        return metrics

    def _actor_trains(self) -> bool:
        """trainer.critic_warmup: the first N steps update the critic only (`global_step` counts the steps done)."""
        return actor_trains(self.global_step, self.cfg.trainer.get("critic_warmup", 0))

    def _score(self, prompts: DataProto, rollout: DataProto, timer: PhaseTimer) -> ScoredRollout:
        """`rollout` (the responses to `prompts`, one row per prompt) with its token-level scores: the rule
        reward, plus the reward model's score and the overlong penalty when configured (ReMax: and the
        greedy baseline)."""
        if self.algo.adv_estimator == "remax":
            with timer("generate_baseline"):
                rollout = self._add_greedy_baseline(prompts, rollout, self.cfg.actor_rollout_ref.rollout.n)
        with timer("reward"):
            reward_started = time.perf_counter()
            # The manager's scores (reward_model.reward_manager; dapo adds the overlong penalty) and each
            # response's task score before that penalty (verl's acc, which filter_groups compares).
            scores, task, reward_metrics = task_scores(self.reward_fn, rollout)
            rule_scores = task.numpy()
            reward_fn_s = time.perf_counter() - reward_started
            if self.roles.reward_model is not None:
                rm_scores = self.roles.reward_model.compute_rm_score(without_routing_table(rollout)).batch["rm_scores"]
                reward_metrics["reward_model_mean"] = float(rm_scores.sum(-1).mean())
                scores = scores + rm_scores
            rollout.batch["token_level_scores"] = scores
        return ScoredRollout(rollout, rule_scores, reward_metrics, reward_fn_s)

    def _keep_mixed_groups(self, first: ScoredRollout, timer: PhaseTimer) -> tuple[ScoredRollout, dict[str, float]]:
        """DAPO's dynamic sampling (trainer/dynamic_sampling.py): `data.train_batch_size` groups whose
        responses differ in `filter_groups.metric`, from as many generation batches as it takes."""
        settings, n = self.algo.filter_groups, self.cfg.actor_rollout_ref.rollout.n

        def draw() -> ScoredRollout:
            prompts = self.draw_prompts()
            rollout = self.rollout_source.generate_sequences(prompts, timer)  # synced this step: a version check
            return self._score(rows_per_prompt(prompts, n), rollout, timer)

        target = self.cfg.data.train_batch_size
        scored, counts = fill_with_mixed_groups(first, draw, target, settings.metric, self._max_gen_batches())
        if counts["filter_groups/topped_up_groups"] and not self._warned_top_up:
            self._warned_top_up = True
            print(
                f"filter_groups: {counts['filter_groups/gen_batches']} generation batches gave "
                f"{counts['filter_groups/mixed_groups']} of {target} groups with differing responses; the batch is "
                "filled up with uniform groups (zero advantage under GRPO). Raise "
                "algorithm.filter_groups.max_num_gen_batches (0: up to the whole dataset) or data.gen_batch_size; "
                "shown once, counted in filter_groups/topped_up_groups",
                file=sys.stderr,
            )
        return scored, counts

    def _max_gen_batches(self) -> int:
        """filter_groups.max_num_gen_batches, or with 0 as many as make one pass over the dataset."""
        cap = self.algo.filter_groups.max_num_gen_batches
        if cap > 0:
            return cap
        return max(len(self.data.train_loader), -(-self.cfg.data.train_batch_size // gen_batch_size(self.cfg)))

    def _importance_weights(self, rollout: DataProto) -> dict[str, float]:
        """With rollout.tis_imp_ratio_cap: per-token weights min(pi_old / pi_rollout, cap) of the policy loss."""
        cap = self.cfg.actor_rollout_ref.rollout.get("tis_imp_ratio_cap")
        if cap is None:
            return {}
        weights, metrics = truncated_is_weights(
            rollout.batch[OLD_LOG_PROBS], rollout.batch[ROLLOUT_LOG_PROBS], rollout.batch["response_mask"], float(cap)
        )
        rollout.batch[ROLLOUT_IS_WEIGHTS] = weights
        return metrics

    def _add_greedy_baseline(self, prompts: DataProto, rollout: DataProto, n: int) -> DataProto:
        greedy = prompts.select(
            batch_keys=["input_ids", "attention_mask", "position_ids"],
            non_tensor_batch_keys=list(prompts.non_tensor_batch),
        )
        greedy.meta_info.update(do_sample=False)
        greedy = self.rollout_source.generate_sequences(greedy)  # timed as the caller's generate_baseline
        baseline, _ = self.reward_fn(greedy)
        rollout.batch["reward_baselines"] = baseline.sum(-1).repeat_interleave(n)
        return rollout

    def _batch_metrics(
        self, rollout: DataProto, reward_metrics: dict, kl_metrics: dict, timer: PhaseTimer
    ) -> dict[str, float]:
        mask = rollout.batch["response_mask"]
        scores = rollout.batch["token_level_scores"].sum(-1)
        lengths = rollout.batch["attention_mask"].sum(-1)
        tokens = int(lengths.sum())
        step_s = sum(timer.seconds.values())
        tokens_per_s = tokens / step_s if step_s else 0.0
        engine_gap = {}
        # else the update reports it
        if ROLLOUT_LOG_PROBS in rollout.batch.keys() and OLD_LOG_PROBS in rollout.batch.keys():
            engine_gap = logprob_gap_metrics(rollout.batch[OLD_LOG_PROBS], rollout.batch[ROLLOUT_LOG_PROBS], mask)
        return {
            **engine_gap,
            "reward/mean": float(scores.mean()),
            "reward/max": float(scores.max()),
            "reward/min": float(scores.min()),
            **{f"reward/{k}": v for k, v in reward_metrics.items()},
            **kl_metrics,
            **agent_metrics(rollout.batch),
            "advantage/mean": float(masked_mean(rollout.batch["advantages"], mask)),
            "response/length_mean": float(mask.sum(-1).float().mean()),
            "perf/tokens": tokens,
            "perf/tokens_per_s": tokens_per_s,
            **self.perf.metrics(lengths.tolist(), mask.sum(-1).tolist(), timer.seconds, tokens_per_s),
            "timing/step_s": step_s,
            **timer.metrics(),
        }

    # ---- driver state kept in checkpoints -----------------------------------------------------------------
    def driver_state(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_ctrl.value}

    def restore_driver_state(self, state: dict[str, Any]) -> None:
        self.kl_ctrl.value = state["kl_coef"]
