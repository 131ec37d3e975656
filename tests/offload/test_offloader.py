"""The offloader on a real FSDP2-sharded model with AdamW state, one rank in this process (CPU, gloo): round
trips move the storages to host buffers and back bit-identically, keep every tensor object, leave training
unchanged and reuse one host buffer per kind of state."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from tests.offload.tiny import (
    LEAK_CHECK,
    UNEVEN,
    device_bytes,
    identical,
    sharded_model,
    snapshot,
    tensor_objects,
    train_step,
)
from workers.fsdp.offload import Offloader
from workers.fsdp.storage_offload import MOVES_KEPT
from workers.training.dist_utils import single_process_group

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def process_group():
    with single_process_group(CPU):
        yield


def offloader(model, optimizer, **kwargs) -> Offloader:
    return Offloader(model, optimizer, CPU, param_offload=True, optimizer_offload=True, move_on_cpu=True, **kwargs)


def test_round_trip_is_bit_identical_and_keeps_every_tensor_object(process_group):
    model, optimizer = sharded_model(UNEVEN)
    train_step(model, optimizer, seed=1)
    before, objects = snapshot(model, optimizer), tensor_objects(model, optimizer)
    resident = device_bytes(model, optimizer)
    moves = offloader(model, optimizer)
    moves.offload()
    assert device_bytes(model, optimizer) == 0  # every storage released while on the host
    transfer = moves.take_transfer()
    assert transfer.d2h_bytes >= resident and transfer.h2d_bytes == 0
    moves.load(with_optimizer=True)
    assert moves.take_transfer().h2d_bytes == transfer.d2h_bytes
    assert identical(before, snapshot(model, optimizer)) == []
    assert all(a is b for a, b in zip(objects, tensor_objects(model, optimizer), strict=True))
    assert moves.param_moves == 2 and moves.optimizer_moves == 2


def test_training_after_round_trips_equals_training_without(process_group):
    plain, plain_opt = sharded_model(UNEVEN, seed=3)
    moved, moved_opt = sharded_model(UNEVEN, seed=3)
    moves = offloader(moved, moved_opt)
    moves.optimizer_only_in_steps()  # the optimizer's state is on the device only inside each step
    for step in range(3):
        moves.offload()
        moves.load()
        assert train_step(moved, moved_opt, seed=step) == train_step(plain, plain_opt, seed=step)
        assert not moves.optimizer_on_device and device_bytes(moved, moved_opt) < device_bytes(plain, plain_opt)
    moves.load(with_optimizer=True)
    assert identical(snapshot(plain, plain_opt), snapshot(moved, moved_opt)) == []
    # the first offload, then the hooks' load and offload around each step, then the last load
    assert moves.optimizer_moves == 1 + 3 * 2 + 1


def test_fifty_round_trips_reuse_one_host_buffer_and_leak_nothing(process_group):
    model, optimizer = sharded_model(LEAK_CHECK)
    train_step(model, optimizer, seed=0)
    before = snapshot(model, optimizer)
    state_bytes = device_bytes(model, optimizer)
    moves = offloader(model, optimizer)
    process = psutil.Process(os.getpid())
    moves.offload()
    moves.load(with_optimizer=True)
    rss = process.memory_info().rss
    for _ in range(50):
        moves.offload()
        moves.load(with_optimizer=True)
    growth = process.memory_info().rss - rss
    assert moves.params.host_allocations == 1 and moves.optimizer_state.host_allocations == 1
    assert len(moves.params.transfer.moves) <= MOVES_KEPT  # timings of untaken transfers are added up, not kept
    assert moves.host_bytes < state_bytes + 64 * 1024  # exact sizes, up to each storage's alignment
    assert growth < state_bytes / 2, f"RSS grew {growth / 2**20:.1f} MiB over 50 round trips"
    assert identical(before, snapshot(model, optimizer)) == []


def test_a_frozen_model_is_copied_to_the_host_once(process_group):
    model, optimizer = sharded_model(UNEVEN, seed=5)
    before = snapshot(model, optimizer)
    moves = Offloader(model, None, CPU, param_offload=True, optimizer_offload=False, frozen=True, move_on_cpu=True)
    copied = []
    for _ in range(3):
        moves.offload_params()
        copied.append(moves.take_transfer().d2h_bytes)
        moves.load_params()
    assert copied[0] > 0 and copied[1:] == [0, 0]
    assert identical(before, snapshot(model, optimizer)) == []


def test_on_cpu_nothing_moves_but_the_moves_are_counted(process_group):
    model, optimizer = sharded_model(UNEVEN)
    train_step(model, optimizer, seed=0)
    resident = device_bytes(model, optimizer)
    moves = Offloader(model, optimizer, CPU, param_offload=True, optimizer_offload=False)
    moves.offload()
    moves.offload()  # already off: not a move
    assert (moves.params_on_device, moves.optimizer_on_device) == (False, True)
    assert device_bytes(model, optimizer) == resident and moves.host_bytes == 0
    moves.load(with_optimizer=True)
    assert (moves.param_moves, moves.optimizer_moves) == (2, 0)


def test_a_checkpoint_loads_into_an_optimizer_the_offloader_moves_each_step(process_group, tmp_path):
    """A resumed run loads its checkpoint before any step: torch's state-dict helpers create AdamW's state with a
    zero-gradient step, whose post-step hook would empty that state's storages before the load copies into them
    (a crash on CPU, CUDA "invalid argument" on a GPU). Held on the device, the state loads exactly."""
    from workers.fsdp import checkpoint

    saved, saved_opt = sharded_model(UNEVEN, seed=3)
    train_step(saved, saved_opt, seed=0)
    checkpoint.save_sharded(str(tmp_path), saved, saved_opt, {}, rank=0)
    model, optimizer = sharded_model(UNEVEN, seed=4)
    moves = offloader(model, optimizer)
    moves.optimizer_only_in_steps()
    moves.offload()
    moves.load(with_optimizer=True)
    with moves.optimizer_held():
        checkpoint.load_sharded(str(tmp_path), model, optimizer, rank=0)
        assert moves.optimizer_on_device
    assert identical(snapshot(saved, saved_opt), snapshot(model, optimizer)) == []
    moves.offload_optimizer()  # after the block it leaves as before, and comes back intact for the next step
    assert not moves.optimizer_on_device
    assert train_step(model, optimizer, seed=1) == train_step(saved, saved_opt, seed=1)
