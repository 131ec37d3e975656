"""A resumable, seeded batch iterator over a dataset, yielding DataProto batches forever."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from protocol import DataProto

from .collate import collate_to_dataproto

# What fixes the batches a sampler yields; a state saved with other values is refused.
_SETTINGS = ("num_samples", "batch_size", "shuffle", "seed", "drop_last")


class ResumableBatchSampler:
    """Index batches across epochs; the state is just (epoch, position within the epoch).

    Epoch e uses the permutation drawn from seed sequence [seed, e], so the order of any
    epoch can be recomputed after a restart without replaying earlier ones.
    """

    def __init__(
        self, num_samples: int, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        batches = num_samples // batch_size if drop_last else -(-num_samples // batch_size)
        if batches == 0:
            raise ValueError(f"{num_samples} samples make no batch of {batch_size} (drop_last={drop_last})")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.batches_per_epoch = batches
        self.epoch = 0
        self.position = 0  # batches already taken in the current epoch
        self._order_epoch = -1
        self._order = np.arange(0)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_samples)
            else:
                self._order = np.arange(self.num_samples)
            self._order_epoch = self.epoch
        return self._order

    def next_indices(self) -> list[int]:
        """The next batch of indices, moving to the next epoch when this one is used up."""
        if self.position >= self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
        start = self.position * self.batch_size
        indices = self._epoch_order()[start : start + self.batch_size]
        self.position += 1
        return [int(i) for i in indices]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_indices()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, **{key: getattr(self, key) for key in _SETTINGS}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # A different dataset size or seed would silently yield other batches: refuse it.
        for key in _SETTINGS:
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"sampler state has {key}={state[key]!r} but this sampler has {getattr(self, key)!r}")
        position = int(state["position"])
        if not 0 <= position <= self.batches_per_epoch:
            raise ValueError(f"sampler state position {position} is outside 0..{self.batches_per_epoch}")
        self.epoch = int(state["epoch"])
        self.position = position


class RLDataLoader:
    """Endless iterator of collated DataProto batches; stop by step count, read `.epoch`.

    Iterating continues from the sampler's state, so `state_dict()` taken after n
    batches and loaded into a fresh loader makes it yield batch n+1 next.
    """

    def __init__(self, dataset: Any, sampler: ResumableBatchSampler) -> None:
        if len(dataset) != sampler.num_samples:
            raise ValueError(f"sampler is for {sampler.num_samples} samples but the dataset has {len(dataset)}")
        self.dataset = dataset
        self.sampler = sampler

    def __len__(self) -> int:
        return len(self.sampler)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def next_batch(self) -> DataProto:
        return collate_to_dataproto([self.dataset[i] for i in self.sampler.next_indices()])

    def __iter__(self) -> Iterator[DataProto]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def make_dataloader(
    dataset: Any, batch_size: int, shuffle: bool = True, seed: int = 0, drop_last: bool = True
) -> RLDataLoader:
    """An endless, resumable DataProto batch iterator over `dataset`."""
    return RLDataLoader(dataset, ResumableBatchSampler(len(dataset), batch_size, shuffle, seed, drop_last))
