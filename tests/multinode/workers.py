"""Worker classes the multi-node drivers place on the cluster's nodes."""

from __future__ import annotations

import os
import time

from single_controller import Dispatch, Worker, register


class NodeProbe(Worker):
    """Reports where it runs and what rendezvous env it sees; joins a gloo group across the nodes."""

    @register(Dispatch.ONE_TO_ALL)
    def where(self) -> dict:
        import ray

        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "env": {key: os.environ.get(key) for key in keys},
        }

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> dict:
        """Joins the default process group (gloo) and sums every rank's number; gathers each rank's node."""
        import ray
        import torch
        import torch.distributed as dist

        self.init_process_group(backend="gloo")
        total = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(total)
        nodes: list = [None] * self.world_size
        dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
        return {"sum": total.item(), "nodes": nodes}

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_forever(self, pause_s: float) -> None:
        """All-reduces until a peer is lost (the collective then raises or blocks)."""
        import torch
        import torch.distributed as dist

        self.init_process_group(backend="gloo")
        while True:
            dist.all_reduce(torch.ones(1))
            time.sleep(pause_s)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def output_of(self, nbytes: int) -> bytes:
        """An output big enough to stay in its node's object store (small ones travel inline to the driver)."""
        return bytes(nbytes)
