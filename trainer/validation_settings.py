"""Checks of the validation settings the driver acts on (free of torch: the config loader imports it). The
values of `actor_rollout_ref.rollout.val_kwargs` are checked with the other rollout keys (workers/config.py)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf


def check_validation_settings(cfg: DictConfig) -> list[str]:
    """Problems with trainer.log_val_generations and rollout.val_kwargs.n (for the config validation)."""
    problems = []
    shown = OmegaConf.select(cfg, "trainer.log_val_generations", default=0)
    if isinstance(shown, bool) or not isinstance(shown, int) or shown < 0:
        problems.append(f"trainer.log_val_generations={shown!r} must be an integer >= 0 (validation samples sent "
                        "to the trackers at each validation; 0: none)")
    n = OmegaConf.select(cfg, "actor_rollout_ref.rollout.val_kwargs.n", default=1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        problems.append(f"actor_rollout_ref.rollout.val_kwargs.n={n!r} must be an integer >= 1 (responses per "
                        "validation prompt)")
    return problems
