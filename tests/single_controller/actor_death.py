"""Waiting for a killed Ray actor to be reported dead (shared by the tests that kill one)."""

from __future__ import annotations

import time

import ray


def dies_within(actor: ray.actor.ActorHandle, seconds: float) -> bool:
    """`ray.kill` only asks for the actor's end: a call sent right after it may still be answered (seen in CI under
    load), so the actor is asked again until its calls fail or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.1)
    return False
