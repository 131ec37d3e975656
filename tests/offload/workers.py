"""Worker of the 2-rank offload test (importable by Ray workers through PYTHONPATH)."""

from __future__ import annotations

import torch

from single_controller import Dispatch, Worker, register
from tests.offload.tiny import UNEVEN, identical, local, sharded_model, snapshot, tensor_objects, train_step
from workers.fsdp.offload import Offloader


class OffloadProbe(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def round_trips_and_training(self, round_trips: int) -> dict:
        """Round trips of an unevenly sharded model with AdamW state, then a step compared with a model
        that never moved."""
        self.init_process_group()
        moved, moved_opt = sharded_model(UNEVEN, seed=7)
        plain, plain_opt = sharded_model(UNEVEN, seed=7)
        train_step(moved, moved_opt, seed=self.rank)
        train_step(plain, plain_opt, seed=self.rank)
        before, objects = snapshot(moved, moved_opt), tensor_objects(moved, moved_opt)
        moves = Offloader(moved, moved_opt, torch.device("cpu"), True, True, move_on_cpu=True)
        for _ in range(round_trips):
            moves.offload()
            moves.load(with_optimizer=True)
        after = snapshot(moved, moved_opt)
        same_objects = all(a is b for a, b in zip(objects, tensor_objects(moved, moved_opt), strict=True))
        losses = (train_step(moved, moved_opt, seed=10 + self.rank), train_step(plain, plain_opt, seed=10 + self.rank))
        padded = [n for n, p in moved.named_parameters()
                  if local(p).untyped_storage().nbytes() > local(p).numel() * local(p).element_size()]
        return {
            "changed": identical(before, after),
            "same_objects": same_objects,
            "losses": losses,
            "differs_from_plain": identical(snapshot(plain, plain_opt), snapshot(moved, moved_opt)),
            "padded_shards": padded,
            "host_allocations": moves.host_allocations,
        }
