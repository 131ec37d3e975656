"""The engine API's weight-sync path follows placement: same GPU -> CUDA IPC, other GPUs -> NCCL, CPU -> gloo."""

import pytest

from single_controller.worker import NodeInfo
from tests.workers.conftest import tiny_model_dir  # noqa: F401
from workers.rollout.sync_path import CUDA_IPC, GLOO, NCCL, choose_sync_path


def _on(gpus_by_rank, node="n0"):
    return [NodeInfo(rank, node, "127.0.0.1", 1000 + rank, tuple(gpus)) for rank, gpus in enumerate(gpus_by_rank)]


def test_cpu_uses_gloo():
    assert choose_sync_path(_on([[], []]), _on([[]]), use_gpu=False, infer_tp=1).kind == GLOO


def test_engines_on_the_train_ranks_gpus_use_cuda_ipc_fed_by_the_rank_on_each_gpu():
    path = choose_sync_path(_on([["0"], ["1"]]), _on([["1"], ["0"]]), use_gpu=True, infer_tp=1)
    assert path.kind == CUDA_IPC
    assert path.feeding_rank == (1, 0)


def test_engines_on_other_gpus_use_nccl():
    assert choose_sync_path(_on([["0"]]), _on([["1"], ["2"]]), use_gpu=True, infer_tp=1).kind == NCCL
    # The same GPU index on another node is another device.
    assert choose_sync_path(_on([["0"]], node="a"), _on([["0"]], node="b"), use_gpu=True, infer_tp=1).kind == NCCL


def test_an_engine_beside_rank_zero_that_ipc_cannot_serve_is_refused_with_what_to_change():
    # Tensor parallel engine on rank 0's GPU: NCCL would see one device twice, IPC serves TP 1 only.
    with pytest.raises(ValueError, match=r"inference rank 0 on GPU \['0', '1'\] \(with a train rank\).*colocate_with=infer"):
        choose_sync_path(_on([["0"], ["1"]]), _on([["0", "1"]]), use_gpu=True, infer_tp=2)
    # One engine shares rank 0's GPU, the other has no train rank on its GPU.
    with pytest.raises(ValueError, match=r"inference rank 1 on GPU \['2'\] \(without a train rank\)"):
        choose_sync_path(_on([["0"]]), _on([["0"], ["2"]]), use_gpu=True, infer_tp=1)


class _Group:
    """What `rollout_weight_sync` reads of a worker group: where its ranks run (and, for the actor, whether
    it has the CUDA IPC sender)."""

    def __init__(self, node_info, sends_ipc=True):
        self.node_info = node_info
        self.worker_class = type("SomeActor", (), {})
        if sends_ipc:
            self.send_ipc = lambda *args: None


def test_trainer_rollout_on_the_actors_gpu_syncs_by_cuda_ipc(tiny_model_dir):
    from workers.rollout.separate_sync import IpcRolloutSync, SeparateWeightSync, rollout_weight_sync

    options = {"tensor_model_parallel_size": 1, "verify_sync": False, "verify_tolerance": None}
    shared = rollout_weight_sync(_Group(_on([["0"]])), _Group(_on([["0"]])), options, str(tiny_model_dir), use_gpu=True)
    assert isinstance(shared, IpcRolloutSync) and shared.transfer.feeding_rank == (0,)  # one GPU, fractional shares
    apart = rollout_weight_sync(_Group(_on([["0"]])), _Group(_on([["1"]])), options, str(tiny_model_dir), use_gpu=True)
    assert isinstance(apart, SeparateWeightSync) and apart.backend == "nccl"
    with pytest.raises(ValueError, match="give the engines GPUs of their own"):
        rollout_weight_sync(_Group(_on([["0"]]), sends_ipc=False), _Group(_on([["0"]])), options, str(tiny_model_dir), use_gpu=True)
