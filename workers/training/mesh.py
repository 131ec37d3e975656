"""The mesh a training worker declares (FSDP: data x Ulysses sequence parallel; Megatron: pp x dp x tp) and the
dispatch over it: a batch is split over the data-parallel ranks only, one output is collected per DP group."""

from __future__ import annotations

from single_controller.mesh import MeshDispatch

TRAIN_MESH = "train"
# Worker methods on rows: the batch split over the data-parallel groups, one output per group.
OVER_DATA_PARALLEL = MeshDispatch(TRAIN_MESH)
# Metrics dicts, one per data-parallel group (already reduced over the ranks by the training logic).
METRICS_OVER_DATA_PARALLEL = MeshDispatch(TRAIN_MESH, outputs="list")
