"""The actor's weight version and per-step metrics, as worker methods shared by the FSDP and Megatron actors."""

from __future__ import annotations

from single_controller import Dispatch, register
from workers.memory import MemoryLog


class ActorStateMixin:
    """Mixed into an actor worker class; call `init_actor_state()` from its `__init__`."""

    def init_actor_state(self) -> None:
        self.weights_version = 0  # bumped whenever the actor's weights change (update, checkpoint load)
        self.step_metrics: dict[str, float] = {}
        self.memory: MemoryLog | None = None

    @register(Dispatch.RANK_ZERO)
    def current_weights_version(self) -> int:
        """Counts the changes of the actor's weights (updates, checkpoint loads): a sync is due when it moved."""
        return self.weights_version

    @register(Dispatch.ONE_TO_ALL)
    def pop_step_metrics(self) -> dict[str, float]:
        """Metrics gathered on this rank since the last call: weight sync, engine timings, memory per phase."""
        metrics, self.step_metrics = {**self.step_metrics, **(self.memory.pop() if self.memory else {})}, {}
        return metrics
