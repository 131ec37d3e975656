"""Worker used by the Megatron process-group tests (importable by Ray workers through PYTHONPATH)."""

import torch
import torch.distributed as dist

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from single_controller.mesh import MeshDispatch
from workers.megatron.parallel import MEGATRON_MESH, init_megatron_parallel


class MegatronMeshWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def init_parallel(self, tp: int, pp: int) -> dict:
        from megatron.core import parallel_state as ps

        placement = init_megatron_parallel(self, tp, pp)
        return {
            "rank": self.rank,
            "tp_rank": ps.get_tensor_model_parallel_rank(),
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
            "dp_rank": ps.get_data_parallel_rank(),
            "tp_group": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
            "dp_group": dist.get_process_group_ranks(ps.get_data_parallel_group()),
            "collector": placement.is_collector,
        }

    @register(dispatch_mode=MeshDispatch(MEGATRON_MESH))
    def compute(self, data: DataProto) -> DataProto:
        from megatron.core import parallel_state as ps

        # Every rank of a TP group must hold the same chunk: the TP all-reduce of its sum is tp x the sum.
        local = data.batch["x"].sum().reshape(1)
        total = local.clone()
        dist.all_reduce(total, group=ps.get_tensor_model_parallel_group())
        out = data.select(batch_keys=["x"])
        out.batch["seen_by"] = torch.full((len(data),), self.rank)
        out.batch["tp_consistent"] = torch.full((len(data),), int(torch.allclose(total, local * ps.get_tensor_model_parallel_world_size())))
        return out
