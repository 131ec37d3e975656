"""Megatron's process groups inside a worker group, lined up with the group's mesh dispatch."""

from __future__ import annotations

from typing import Any

from single_controller.mesh import MeshPlacement
from workers.training.mesh import TRAIN_MESH


def megatron_mesh_shape(world_size: int, tp: int, pp: int, ep: int = 1, etp: int | None = None) -> dict[str, int]:
    """Megatron orders ranks TP fastest, then DP, then PP: row-major {pp, dp, tp}. The experts lay the same ranks
    of a pipeline stage out again as expert-TP `etp` (default: `tp`) x EP `ep` x expert-DP ("parallel folding":
    verl's MoE scripts run TP 4 with expert TP 1), so expert-TP x EP must divide TP x DP."""
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise ValueError(
            f"{world_size} workers cannot hold tensor parallel {tp} x pipeline parallel {pp}; the product must "
            f"divide the worker count (data parallel = workers / (tp * pp))"
        )
    dp = world_size // (tp * pp)
    expert_tp = tp if etp is None else etp
    stage_ranks = tp * dp
    if expert_tp < 1 or stage_ranks % expert_tp:
        raise ValueError(
            f"expert_tensor_parallel_size={expert_tp} must divide the {stage_ranks} ranks of a pipeline stage "
            f"(tp={tp} x dp={dp}); valid sizes: {[e for e in range(1, stage_ranks + 1) if stage_ranks % e == 0]}"
        )
    per_expert_copy = stage_ranks // expert_tp
    if ep < 1 or per_expert_copy % ep:
        what = (
            f"the data-parallel size {dp} (= {world_size} workers / (tp={tp} x pp={pp}))" if expert_tp == tp
            else f"{per_expert_copy} (= tp {tp} x dp {dp} / expert_tensor_parallel_size {expert_tp})"
        )
        raise ValueError(
            f"expert_model_parallel_size={ep} must divide {what}; valid EP sizes: "
            f"{[e for e in range(1, per_expert_copy + 1) if per_expert_copy % e == 0]}"
        )
    return {"pp": pp, "dp": dp, "tp": tp}


def init_megatron_groups(world_size: int, tp: int, pp: int, ep: int = 1, etp: int | None = None) -> dict[str, int]:
    """Megatron's TP/PP/DP (and expert EP / expert-TP) groups over the default process group (once per process; the
    strategy API's too); returns the mesh shape."""
    from megatron.core import parallel_state

    shape = megatron_mesh_shape(world_size, tp, pp, ep, etp)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp,
        )
    return shape


def init_megatron_parallel(worker: Any, tp: int, pp: int, ep: int = 1, etp: int | None = None) -> MeshPlacement:
    """Create Megatron's TP/PP/DP groups over the worker group's default process group and declare the same
    layout as the worker's mesh `TRAIN_MESH`, so `MeshDispatch(TRAIN_MESH)` methods get their data
    split over DP only and are collected from TP rank 0 of the last PP stage. Returns this rank's placement."""
    from megatron.core import parallel_state

    worker.init_process_group()
    shape = init_megatron_groups(worker.world_size, tp, pp, ep, etp)
    placement = worker.declare_mesh(TRAIN_MESH, shape)
    ours = (worker.rank // (shape["dp"] * tp), placement.dp_rank, worker.rank % tp)
    megatron = (
        parallel_state.get_pipeline_model_parallel_rank(),
        parallel_state.get_data_parallel_rank(),
        parallel_state.get_tensor_model_parallel_rank(),
    )
    if ours != megatron:
        # A different rank order would hand a DP group's chunk to ranks of another group.
        raise RuntimeError(f"rank {worker.rank}: mesh (pp, dp, tp) = {ours} but Megatron placed it at {megatron}")
    return placement
