"""Checks of the rollout settings the driver loop acts on (kept free of torch: the config loader imports it)."""

from __future__ import annotations

from omegaconf import DictConfig

STALENESS_VALUES = (0, 1)  # steps between the weights that generate a batch and the update that uses it


def check_rollout_settings(cfg: DictConfig) -> list[str]:
    """Problems with rollout.staleness / rollout.tis_imp_ratio_cap (for the config validation)."""
    rollout = cfg.actor_rollout_ref.rollout
    problems = []
    staleness = rollout.staleness
    if isinstance(staleness, bool) or staleness not in STALENESS_VALUES:
        problems.append(
            f"actor_rollout_ref.rollout.staleness={staleness!r} is not valid; choose one of {list(STALENESS_VALUES)} "
            "(0: generate each batch with the newest weights, 1: one step off, generating while the actor trains)"
        )
    elif staleness == 1 and not (rollout.name == "vllm" and rollout.placement == "separate"):
        problems.append(
            "actor_rollout_ref.rollout.staleness=1 needs engines of their own to generate while the actor trains: "
            f"set rollout.name=vllm and rollout.placement=separate (got name={rollout.name!r}, placement={rollout.placement!r})"
        )
    cap = rollout.tis_imp_ratio_cap
    if cap is not None:
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap < 1:
            problems.append(f"actor_rollout_ref.rollout.tis_imp_ratio_cap={cap!r} must be null (off) or a number >= 1")
        elif rollout.name != "vllm":
            problems.append(
                "actor_rollout_ref.rollout.tis_imp_ratio_cap needs the engine's log-probs of the sampled tokens, which "
                f"rollout.name=vllm returns (got {rollout.name!r})"
            )
    return problems
