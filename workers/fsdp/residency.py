"""When the actor's parameters and optimizer state move: only when the GPU is wanted by another tenant.

Tenants of a trainer GPU, in one process: the actor, its reference, a hybrid vLLM engine, and (colocated
placement) a critic and a reward model. `DeviceTenants` is the process's register of who can give memory
back: a tenant about to compute `claim`s the device and the others release what they hold.

The actor worker's policy (a `Residency` of the actor and its reference), with
`actor.fsdp_config.param_offload` / `optimizer_offload` and `ref.fsdp_config.param_offload`:
- configured models leave the GPU once before the rollout engine starts (its start then finds the memory);
- the actor's parameters come to the GPU when a phase needs them and stay until another tenant claims it:
  the hybrid engine after its weight sync (for generation), or a colocated critic / reward model. Old
  log-probs -> reference -> update therefore move nothing, and the weight sync finds them in place;
- the optimizer's state is on the GPU only inside each optimizer step (and for checkpoints);
- the reference comes in for its log-probs and leaves right after; its host copy stays valid (frozen), so
  leaving only frees the device memory.

The critic worker's policy (`Residency` of the critic, `critic.model.fsdp_config`) is the actor's; its
parameters leave once at the end of its start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ContextManager

from workers.fsdp.offload import GIB, Offloader, transfer_metrics
from workers.fsdp.storage_offload import Transfer

ACTOR, ROLLOUT, CRITIC, REWARD_MODEL = "actor", "rollout", "critic", "reward_model"


class DeviceTenants:
    """The models of one process sharing its GPU. `register(name, release)`: how a tenant gives its memory
    back; `claim(name)`: `name` is about to compute, every other tenant releases."""

    def __init__(self) -> None:
        self._releases: dict[str, Callable[[], None]] = {}
        self.claims: list[str] = []  # who claimed, in order (for tests and logs)

    def register(self, name: str, release: Callable[[], None]) -> None:
        self._releases[name] = release

    def claim(self, name: str) -> None:
        self.claims.append(name)
        for other, release in self._releases.items():
            if other != name:
                release()


_PROCESS_TENANTS = DeviceTenants()


def process_tenants() -> DeviceTenants:
    """The tenants of this process's GPU (colocated roles share one process, hence one register)."""
    return _PROCESS_TENANTS


class Residency:
    """A worker's placement policy (module docstring) over the offloaders of the model it trains (`trained`, the
    tenant `tenant`; None for role "ref") and of the actor's frozen reference (`ref`)."""

    def __init__(
        self, tenant: str, trained: Offloader | None, tenants: DeviceTenants, ref: Offloader | None = None
    ) -> None:
        self.tenant, self.trained, self.ref, self.tenants = tenant, trained, ref, tenants
        self.offloaders = [o for o in (trained, ref) if o is not None]
        self.reports = any(o.offloads for o in self.offloaders)
        self._counted: dict[str, int] = {}
        if trained is not None:
            trained.optimizer_only_in_steps()
            tenants.register(tenant, trained.offload_params)

    def offload(self) -> None:
        """What is configured to leave goes to the host until first needed (the actor's models before the rollout
        engine starts, the critic at the end of its start)."""
        for offloader in self.offloaders:
            offloader.offload()

    def trained_needed(self, with_optimizer: bool = False) -> None:
        """The trained model computes next: the other tenants release the GPU, its own state comes in."""
        self.tenants.claim(self.tenant)
        self.trained.load(with_optimizer)

    def optimizer_held(self) -> ContextManager[None]:
        """The optimizer state stays on the device inside the block (a checkpoint's save or load); it leaves at
        the phase's end."""
        return self.trained.optimizer_held() if self.trained is not None else contextlib.nullcontext()

    def rollout_needs_device(self) -> None:
        """The hybrid engine generates next: the actor's parameters leave (after the sync that read them)."""
        self.tenants.claim(ROLLOUT)

    def ref_needed(self) -> None:
        self.ref.load_params()

    def ref_done(self) -> None:
        self.ref.offload_params()

    def end_phase(self, phase: str) -> dict[str, float]:
        """The optimizer's state leaves if a checkpoint brought it; returns the phase's `offload/<phase>/...`
        metrics (none when nothing is configured to offload)."""
        if self.trained is not None:
            self.trained.offload_optimizer()
        if not self.reports:
            return {}
        transfer = Transfer()
        for offloader in self.offloaders:
            transfer.add(offloader.take_transfer())
        counts = {}
        if self.trained is not None:
            counts.update({f"{self.tenant}_{kind}": n for kind, n in self.trained.move_counts().items()})
        if self.ref is not None:
            counts["ref_params"] = self.ref.param_moves
        moves = {name: count - self._counted.get(name, 0) for name, count in counts.items()}
        self._counted = counts
        return transfer_metrics(phase, transfer, moves)

    @property
    def host_bytes(self) -> int:
        return sum(o.host_bytes for o in self.offloaders)


class ResidencyHooks:
    """The residency hooks of a backend's side (workers/training/side.py `TrainedSide`) answered by its
    `Residency`: shared by the FSDP and Megatron sides."""

    residency: Residency
    host_buffers_metric: str  # the metric of the host memory the offloaded state holds

    def trained_needed(self, with_optimizer: bool = False) -> None:
        self.residency.trained_needed(with_optimizer)

    def optimizer_held(self) -> ContextManager[None]:
        return self.residency.optimizer_held()

    def end_phase(self, phase: str) -> dict[str, float]:
        """Nothing leaves the GPU here but optimizer state a checkpoint brought: the trained model's parameters
        stay until another tenant claims the device."""
        metrics = self.residency.end_phase(phase)
        if metrics:
            metrics[self.host_buffers_metric] = self.residency.host_bytes / GIB
        return metrics
