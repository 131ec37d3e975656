"""Whether a step runs the actor's old log-prob pass (`actor_rollout_ref.actor.old_log_prob_pass`).

PPO's ratio is taken against pi_old, the actor's log-probs of the batch before the update. When the update
makes exactly one optimizer step over the batch (one epoch, one mini-batch), pi_old is the policy the
update's own forward pass runs: its log-probs, detached, are pi_old exactly, so the separate pass only
repeats a forward over the whole batch. `auto` skips it then; the update stands in (workers/training/actor_loss.py),
including the truncated importance weights and the engine-vs-trainer log-prob gap. Free of torch: the config
loader imports it.
"""

from __future__ import annotations

from omegaconf import DictConfig


def old_log_prob_pass_needed(cfg: DictConfig) -> bool:
    """True unless `auto` and the update can stand in for the pass: FSDP actor, one epoch, one mini-batch
    per step (ppo_mini_batch_size = data.train_batch_size) and no KL penalty in the reward (which the
    driver computes from pi_old before the advantages)."""
    actor = cfg.actor_rollout_ref.actor
    if actor.get("old_log_prob_pass", "auto") == "always":
        return True
    one_step = int(actor.ppo_epochs) == 1 and int(actor.ppo_mini_batch_size) >= int(cfg.data.train_batch_size)
    return not (one_step and actor.get("strategy", "fsdp") == "fsdp" and not cfg.algorithm.use_kl_in_reward)
