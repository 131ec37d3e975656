"""`BackendHooks`: callables a training backend runs at named points of an update (the Megatron offloader's moves,
workers/megatron/offload.py: the gradient buffers come back at `zero_grad`, the optimizer's state around the step)."""

from __future__ import annotations

from collections.abc import Callable


class BackendHooks:
    """Callables a backend runs at named points of training, in the order they were added."""

    POINTS = ("before_zero_grad", "before_step", "after_step")

    def __init__(self) -> None:
        self._at: dict[str, list[Callable[[], None]]] = {point: [] for point in self.POINTS}

    def add(self, **hooks: Callable[[], None]) -> dict[str, Callable[[], None]]:
        unknown = sorted(set(hooks) - set(self.POINTS))
        if unknown:
            raise ValueError(f"unknown hook point(s) {unknown}; valid: {list(self.POINTS)}")
        for point, hook in hooks.items():
            self._at[point].append(hook)
        return hooks

    def run(self, point: str) -> None:
        for hook in self._at[point]:
            hook()
