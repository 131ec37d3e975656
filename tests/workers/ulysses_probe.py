"""A model-free worker on the FSDP workers' Ulysses layout, to see what each rank receives and returns."""

from __future__ import annotations

import torch
import torch.distributed as dist

from protocol import DataProto
from single_controller import Dispatch, Worker, register
from workers.fsdp.ulysses import init_sequence_layout
from workers.training.mesh import METRICS_OVER_DATA_PARALLEL, OVER_DATA_PARALLEL


class LayoutProbe(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, size: int) -> dict[str, int]:
        self.init_process_group()
        self.layout = init_sequence_layout(self, size, "actor.ulysses_sequence_parallel_size")
        group = self.layout.group
        return {"dp_size": self.layout.dp_size, "sp_rank": 0 if group is None else group.rank}

    @register(OVER_DATA_PARALLEL)
    def echo(self, data: DataProto) -> DataProto:
        """The rows received, tagged with the rank that returns them."""
        return DataProto.from_dict({"row": data.batch["row"], "rank": torch.full((len(data),), self.rank)})

    @register(METRICS_OVER_DATA_PARALLEL)
    def group_view(self, data: DataProto) -> dict[str, object]:
        """This rank's rows and whether every rank of its sequence-parallel group received the same rows."""
        rows = data.batch["row"]
        group = self.layout.group
        gathered = [torch.empty_like(rows) for _ in range(group.size)]
        dist.all_gather(gathered, rows, group=group.group)
        return {"rank": self.rank, "rows": rows.tolist(), "group_same": all(torch.equal(g, rows) for g in gathered)}
