"""Which finished prompt groups a step of asynchronous training takes, under a staleness bound.

Versions are the actor's weights versions (updates and checkpoint loads counted). A group's age at an
update is the actor's version before that update minus the version of the group's *oldest* token (a
response continued across a weight update is as old as its first token). `max_staleness=k` lets a step at
version V train on groups whose oldest token is from V-k or later:

- a finished group older than that is *expired*: never trained on; the caller drops it or regenerates its
  prompt (`stale_groups=drop|regenerate`; with `wait` this happens only when more than a batch became due
  at once);
- with `stale_groups=wait`, a group still generating whose oldest token is from V-k or earlier is *due*: after
  this update it would be too old, so the step waits for it and trains on it now (nothing is thrown away;
  a long response holds the trainer back at most once every k+1 updates);
- otherwise the step takes the `batch_size` oldest finished groups as soon as that many are there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.rollout_choices import STALE_GROUP_POLICIES


@dataclass
class FinishedGroup:
    uid: str
    rows: Any  # the group's rollout rows (a DataProto)
    oldest: int  # weights version of its oldest token
    newest: int
    arrival: int  # order of arrival, to break ties


class GroupBuffer:
    def __init__(self, batch_size: int, max_staleness: int, policy: str) -> None:
        if policy not in STALE_GROUP_POLICIES:
            raise ValueError(f"stale_groups={policy!r}; valid: {list(STALE_GROUP_POLICIES)}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.batch_size, self.max_staleness, self.policy = batch_size, max_staleness, policy
        self.groups: dict[str, FinishedGroup] = {}
        self._arrivals = 0

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, uid: str, rows: Any, oldest: int, newest: int) -> None:
        if uid in self.groups:
            raise ValueError(f"prompt group {uid!r} arrived twice")
        self.groups[uid] = FinishedGroup(uid, rows, oldest, newest, self._arrivals)
        self._arrivals += 1

    def floor(self, version: int) -> int:
        """The oldest token version a step at `version` may train on."""
        return version - self.max_staleness

    def expire(self, version: int) -> list[FinishedGroup]:
        """Remove and return the finished groups too old for a step at `version`."""
        stale = [g for g in self.groups.values() if g.oldest < self.floor(version)]
        for group in stale:
            del self.groups[group.uid]
        return stale

    def due_in_progress(self, version: int, in_progress: dict[str, int | None]) -> list[str]:
        """Groups still generating that a step at `version` must wait for (policy `wait`)."""
        if self.policy != "wait":
            return []
        return [uid for uid, oldest in in_progress.items() if oldest is not None and oldest <= self.floor(version)]

    def take(self, version: int, in_progress: dict[str, int | None]) -> list[FinishedGroup] | None:
        """`batch_size` groups for the update at `version`, oldest first, or None while the step must wait:
        fewer are finished, or (policy `wait`) a due group is still generating and would still fit. Call
        `expire` first."""
        ready = sorted(self.groups.values(), key=lambda g: (g.oldest, g.arrival))
        if len(ready) < self.batch_size:
            return None
        due_finished = sum(1 for g in ready if g.oldest <= self.floor(version))
        if due_finished < self.batch_size and self.due_in_progress(version, in_progress):
            return None
        taken = ready[: self.batch_size]
        for group in taken:
            del self.groups[group.uid]
        return taken
