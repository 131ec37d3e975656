"""Which settings routing replay works with, checked with the rest of the worker config (no torch here)."""

from __future__ import annotations

from typing import Any


def check_routing_replay(config: dict[str, Any], where: str) -> None:
    """`actor.router_replay.mode` and `rollout.enable_rollout_routing_replay` of a completed actor_rollout_ref
    config; `where` prefixes the keys named in errors."""
    mode = config["actor"]["router_replay"]["mode"]
    rollout = config["rollout"]
    records = rollout["enable_rollout_routing_replay"]
    if mode == "disabled" and not records:
        return
    prefix = f"{where}." if where else ""
    mode_key, rollout_key = f"{prefix}actor.router_replay.mode", f"{prefix}rollout.enable_rollout_routing_replay"
    if mode == "R3" and not records:
        raise ValueError(
            f"{mode_key}=R3 replays the experts the rollout chose: set {rollout_key}=true too (verl's pair), or "
            f"{mode_key}=R2 to replay those of the log-prob pass"
        )
    if mode == "R2" and records:
        raise ValueError(
            f"{mode_key}=R2 replays the experts the trainer's own log-prob pass chose, {rollout_key}=true is for R3's "
            f"(the rollout's); set {mode_key}=R3, or {rollout_key}=false"
        )
