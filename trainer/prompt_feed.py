"""Prompts one at a time for asynchronous training, with what a checkpoint needs to lose and repeat none.

The feed pulls whole batches from the dataloader and hands their prompts out one by one, each with a uid
unique in the run. A prompt is *open* from the moment it is pulled until it is settled (trained on, or
dropped as too stale). A checkpoint holds the dataloader position after everything pulled (saved by the step loop)
plus the open prompts in order; a resumed run hands those out again first (they were in flight, buffered or not yet
handed out when the run stopped), so no prompt trained on is repeated and none is skipped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from protocol import DataProto
from trainer.data import collate_to_dataproto


@dataclass(frozen=True)
class PromptRef:
    uid: str
    position: int  # the dataset row


class PromptFeed:
    def __init__(self, loader: Any) -> None:
        self.loader = loader  # a trainer.data.RLDataLoader (its sampler and dataset)
        self.queue: deque[PromptRef] = deque()  # pulled (or to be regenerated), not handed out yet
        self.open: dict[str, PromptRef] = {}  # pulled and not settled, in the order pulled
        self.pulled = 0  # prompts pulled from the loader in this run and the runs it resumes

    def take(self, count: int) -> list[PromptRef]:
        """The next `count` prompts to hand out (a prompt given back by `requeue` comes first)."""
        taken = []
        while len(taken) < count:
            if not self.queue:
                self._pull()
            taken.append(self.queue.popleft())
        return taken

    def _pull(self) -> None:
        for position in self.loader.sampler.next_indices():
            ref = PromptRef(f"p{self.pulled}", int(position))
            self.pulled += 1
            self.queue.append(ref)
            self.open[ref.uid] = ref

    def requeue(self, uid: str) -> None:
        """Hand this open prompt out again, before any other (its group is to be regenerated)."""
        self.queue.appendleft(self.open[uid])

    def settle(self, uid: str) -> None:
        """The prompt was trained on (or dropped): a checkpoint no longer carries it."""
        del self.open[uid]

    def outstanding(self) -> int:
        """Open prompts already handed out (generating, or finished and waiting for a step)."""
        return len(self.open) - len(self.queue)

    def rows(self, refs: list[PromptRef]) -> DataProto:
        """The prompts as a batch (the dataset's items) with their `uid`."""
        batch = collate_to_dataproto([self.loader.dataset[ref.position] for ref in refs])
        return batch.union(DataProto.from_dict(non_tensors={"uid": np.array([ref.uid for ref in refs], dtype=object)}))

    # ---- checkpoints (the dataloader's own state is saved next to this) ----------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"open": [[ref.uid, ref.position] for ref in self.open.values()], "pulled": self.pulled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume (the dataloader restored to the same save): the prompts open then are handed out first."""
        self.pulled = int(state["pulled"])
        refs = [PromptRef(str(uid), int(position)) for uid, position in state["open"]]
        self.open = {ref.uid: ref for ref in refs}
        self.queue = deque(refs)
