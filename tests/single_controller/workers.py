"""Worker classes used by the single_controller tests (importable by Ray workers through PYTHONPATH)."""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from protocol import DataProto
from single_controller import Dispatch, Execute, MeshDispatch, Worker, register


class EchoWorker(Worker):
    """Small methods exercising every dispatch mode."""

    def __init__(self, offset: int = 0) -> None:
        super().__init__()
        self.offset = offset
        self.state = 0

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self, tag: str = "") -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "tag": tag, "pid": os.getpid()}

    @register(Dispatch.ALL_TO_ALL)
    def add_rank(self, value: int) -> int:
        return value + self.rank

    @register(Dispatch.DP_COMPUTE)
    def double(self, values: list) -> list:
        return [2 * v for v in values]

    @register(Dispatch.DP_COMPUTE_PROTO)
    def plus_offset(self, data: DataProto) -> DataProto:
        out = data.select(batch_keys=["x"])
        out.batch["y"] = data.batch["x"] + self.offset
        out.batch["rank"] = torch.full((len(data),), self.rank)
        return out

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_async(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def plus_offset_async(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict({"x": data.batch["x"], "y": data.batch["x"] + self.offset})
        out.batch["producer_pid"] = torch.full((len(data),), os.getpid())
        return out

    @register(Dispatch.DP_COMPUTE_PROTO)
    def record_sources(self, data: DataProto) -> DataProto:
        # Reports what arrived here, to check that chained futures travelled worker to worker.
        out = data.select(batch_keys=["x", "y"])
        out.batch["consumer_rank"] = torch.full((len(data),), self.rank)
        return out

    @register(Dispatch.DP_COMPUTE_PROTO)
    def increment_in_place(self, data: DataProto) -> DataProto:
        data.batch["x"] += 1  # writes into what this worker received
        return data.select(batch_keys=["x"])

    @register(Dispatch.DP_COMPUTE_METRIC)
    def chunk_sizes(self, data: DataProto) -> dict:
        return {"rank": self.rank, "rows": len(data), "sum": float(data.batch["x"].sum())}

    @register(Dispatch.RANK_ZERO)
    def only_rank_zero(self) -> int:
        self.state += 1
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def get_state(self) -> int:
        return self.state

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def rank_zero_execute(self) -> int:
        self.state += 10
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def summarize_parts(self, items: list, scale: int) -> dict:
        return {"rank": self.rank, "items": list(items), "scale": scale}

    @register(Dispatch.SPLIT_JOIN)
    def scale_tensor(self, values: torch.Tensor, scale: float) -> torch.Tensor:
        return values * scale

    @register(Dispatch.ONE_TO_ALL)
    def fail_on_rank(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"deliberate failure on rank {self.rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def exit_on_rank(self, rank: int) -> int:
        if self.rank == rank:
            os._exit(1)
        time.sleep(0.2)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


def _tagged_dispatch(worker_group, data: DataProto):
    # Custom split: every worker gets the whole batch plus its own tag.
    return ([data] * worker_group.world_size, [f"tag{r}" for r in range(worker_group.world_size)]), {}


def _tagged_collect(worker_group, outputs):
    return DataProto.concat(outputs)


class CustomDispatchWorker(Worker):
    @register(dispatch_mode={"dispatch_fn": _tagged_dispatch, "collect_fn": _tagged_collect})
    def tag_rows(self, data: DataProto, tag: str) -> DataProto:
        out = data.select(batch_keys=["x"])
        out.non_tensor_batch["tag"] = np.array([tag] * len(data), dtype=object)
        return out


class DistributedWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def init_dist(self) -> str:
        self.init_process_group(backend="gloo")
        return os.environ["MASTER_PORT"]

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        import torch.distributed as dist

        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())


class InitJoinsDistributedWorker(Worker):
    """Joins torch.distributed in __init__: works only when every rank starts with the master address set."""

    def __init__(self) -> None:
        self.init_process_group(backend="gloo")

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        return DistributedWorker.all_reduce_rank(self)


class Rank0FailsInInitWorker(Worker):
    def __init__(self) -> None:
        if self.rank == 0:
            raise RuntimeError("rank 0 cannot load its model")

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


class MeshWorker(Worker):
    """Declares a 2x2 (dp x tp) mesh; reports which chunk each rank saw."""

    @register(Dispatch.ONE_TO_ALL)
    def init_mesh(self, dp: int, tp: int) -> dict:
        placement = self.declare_mesh("actor", {"dp": dp, "tp": tp})
        return {"rank": self.rank, "dp_rank": placement.dp_rank, "collector": placement.is_collector}

    @register(dispatch_mode=MeshDispatch("actor"))
    def compute(self, data: DataProto) -> DataProto:
        out = data.select(batch_keys=["x"])
        out.batch["seen_by"] = torch.full((len(data),), self.rank)
        return out


class ActorRole(Worker):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr

    @register(Dispatch.ONE_TO_ALL)
    def describe(self) -> dict:
        return {"role": "actor", "rank": self.rank, "pid": os.getpid(), "lr": self.lr}

    @register(Dispatch.DP_COMPUTE_PROTO)
    def score(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"score": data.batch["x"].float() * self.lr})


class RefRole(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def describe(self) -> dict:
        return {"role": "ref", "rank": self.rank, "pid": os.getpid()}

    @register(Dispatch.ONE_TO_ALL)
    def init_mesh(self) -> int:
        return self.declare_mesh("ref", {"dp": self.world_size}).dp_rank

    @register(dispatch_mode=MeshDispatch("ref"))
    def ref_score(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"ref": -data.batch["x"].float()})


def make_batch(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n)}, non_tensors={"uid": np.array([f"s{i}" for i in range(n)], dtype=object)}
    )



class ClosingWorker(Worker):
    """`close` leaves a file per rank (and role) in `folder`; the rank `hangs` never finishes closing."""

    def __init__(self, folder: str, role: str = "worker", hangs: int = -1) -> None:
        super().__init__()
        self.folder, self.role, self.hangs = folder, role, hangs

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> int:
        return self.rank

    def close(self) -> None:
        if self.rank == self.hangs:
            time.sleep(600)
        with open(os.path.join(self.folder, f"{self.role}_{self.rank}"), "a") as marker:  # a line per close
            marker.write(f"{os.getpid()}\n")
