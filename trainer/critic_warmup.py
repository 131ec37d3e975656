"""`trainer.critic_warmup` (verl's key): the first N steps update only the critic; the actor trains from step N + 1.

Only a run with a critic (algorithm.adv_estimator=gae, algorithm=ppo) may set it above 0: a warmup with nothing to
warm up is surely a mistake, so the config check names the key instead of ignoring it (verl ignores it). 0, what
verl's GRPO scripts pass, is always accepted. Free of torch: the config loader imports it.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

KEY = "trainer.critic_warmup"


def check_critic_warmup(cfg: DictConfig) -> list[str]:
    """Problems with trainer.critic_warmup (an integer >= 0; above 0 only with a critic)."""
    value = OmegaConf.select(cfg, KEY, default=0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return [f"{KEY}={value!r} must be an integer >= 0 (the first steps that update only the critic)"]
    estimator = OmegaConf.select(cfg, "algorithm.adv_estimator")
    if value > 0 and estimator != "gae":
        return [(
            f"{KEY}={value} updates only the critic for the first {value} steps, but algorithm.adv_estimator="
            f"{estimator!r} trains no critic (only gae, algorithm=ppo, does): set {KEY}=0 or use algorithm=ppo"
        )]
    return []


def actor_trains(step_done: int, warmup: int) -> bool:
    """Whether the step after `step_done` finished steps updates the actor (`warmup`: trainer.critic_warmup)."""
    return step_done >= warmup
