"""Which weight-sync path a trainer group uses to reach a separate group of inference engines (the trainer's
separate rollout, the engine API), read from where their workers run.

- same GPU (each engine shares its device with a train rank): CUDA IPC buckets, no copy between devices;
- other GPUs: a bucketed NCCL broadcast from train rank 0 (NCCL refuses two group ranks on one device, so
  no engine may sit on train rank 0's GPU);
- CPU: the same broadcast over gloo.
The in-process path (the engine inside the trainer's process, no transfer) is the hybrid rollout's
(`rollout.placement=hybrid`) and the strategy API's; the engine API always runs its two engines in separate
worker groups.
"""

from __future__ import annotations

from dataclasses import dataclass

from single_controller.worker import NodeInfo

CUDA_IPC, NCCL, GLOO = "cuda_ipc", "nccl", "gloo"
SYNC_PATHS = (CUDA_IPC, NCCL, GLOO)


@dataclass(frozen=True)
class SyncPath:
    kind: str  # one of SYNC_PATHS
    # CUDA IPC only: for each inference worker (by rank), the train rank on the same device that feeds it.
    feeding_rank: tuple[int, ...] = ()


def _overlap(a: NodeInfo, b: NodeInfo) -> bool:
    """Whether two workers use a common GPU (a GPU id names a device on its own node only)."""
    return a.node_id == b.node_id and bool(set(a.gpu_ids) & set(b.gpu_ids))


def choose_sync_path(train: list[NodeInfo], infer: list[NodeInfo], use_gpu: bool, infer_tp: int) -> SyncPath:
    """The path for this placement; a placement no path can serve raises ValueError saying what to change."""
    if not use_gpu:
        return SyncPath(GLOO)
    # For each inference worker, the first train rank sharing a GPU with it (None: none does).
    shared = [next((t.rank for t in train if _overlap(t, info)), None) for info in infer]
    if infer_tp == 1 and all(rank is not None for rank in shared):
        return SyncPath(CUDA_IPC, tuple(shared))
    rank_zero = next(t for t in train if t.rank == 0)
    if not any(_overlap(rank_zero, info) for info in infer):  # the broadcast group is rank 0 plus the engines
        return SyncPath(NCCL)
    placement = ", ".join(
        f"inference rank {info.rank} on GPU {list(info.gpu_ids)} "
        f"({'with' if rank is not None else 'without'} a train rank)"
        for info, rank in zip(infer, shared)
    )
    raise ValueError(
        f"no weight-sync path for this placement: {placement}, tensor_parallel_size={infer_tp}. CUDA IPC needs every "
        "inference engine (tensor_parallel_size 1) on the GPU of a train rank (build the train engine with "
        "colocate_with=infer); NCCL needs every engine off train rank 0's GPU (separate pools)"
    )
