"""`save_checkpoint` / `load_checkpoint` of a worker that trains one model (the actor, the critic), written once."""

from __future__ import annotations

from single_controller import Dispatch, register


class CheckpointMethods:
    """Mixed into a worker class that has `side` (its backend's side: `optimizer_held()`), `update_calls`,
    `_resident(method, with_optimizer)` (the trained `TrainBackend`, its state on the device) and
    `_end_phase(phase)`."""

    checkpoint_phase_prefix = ""  # phase names in the offload metrics: the critic's are prefixed "critic_"

    def _checkpoint_loaded(self, phase: str) -> None:
        """The loaded weights are in place (an actor overrides this: its rollout needs them next)."""
        self._end_phase(phase)

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """The sharded model with its optimizer, LR schedule, RNG states and update counter."""
        engine = self._resident("save_checkpoint", with_optimizer=True)
        with self.side.optimizer_held():
            engine.save_checkpoint(path, {"update_calls": self.update_calls})
        self._end_phase(f"{self.checkpoint_phase_prefix}save_checkpoint")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        engine = self._resident("load_checkpoint", with_optimizer=True)
        with self.side.optimizer_held():  # the load may create the optimizer's state with a step
            extra = engine.load_checkpoint(path)
        self.update_calls = int(extra["update_calls"])
        self._checkpoint_loaded(f"{self.checkpoint_phase_prefix}load_checkpoint")
