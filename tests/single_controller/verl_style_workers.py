"""Workers written the way verl's tutorials and workers write them, with only the imports renamed
(importable by Ray workers through PYTHONPATH; used by test_tutorial_dispatch.py and test_verl_parity.py)."""

from __future__ import annotations

import asyncio
import os

import torch
from tensordict import NonTensorData, TensorDict

from protocol import DataProto
from single_controller.base import Worker
from single_controller.base.decorator import (
    DISPATCH_MODE_FN_REGISTRY,
    Dispatch,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
)

# ---- the online DPO tutorial's custom dispatch, verbatim ----------------------------------------------


def dispatch_data(worker_group, data):
    return data.chunk(worker_group.world_size)


def collect_data(worker_group, data):
    return DataProto.concat(data)


def collect_with_torch_cat(worker_group, output):
    return torch.cat(output)  # the outputs are DataProtos: torch.cat means DataProto.concat


# ---- malformed dispatch functions (each must give one clear error) -----------------------------------


def dispatch_whole(worker_group, data):
    return data  # forgot to split


def dispatch_one_chunk(worker_group, data):
    return data.chunk(1)  # one entry, whatever the world size


def dispatch_first_only(worker_group, data, *rest, **named):
    return data.chunk(worker_group.world_size)  # per-rank entries for one argument, but the call had more


def dispatch_bad_kwargs(worker_group, data, scale):
    return (data.chunk(worker_group.world_size),), {"scale": scale}  # a kwarg that is not per rank


class TutorialGenerator(Worker):
    @register(dispatch_mode={"dispatch_fn": dispatch_data, "collect_fn": collect_data})
    def generate_sequences(self, data):
        out = DataProto.from_dict({"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)})
        out.meta_info["metrics"] = {"rows": len(data), "rank": self.rank}
        return out

    @register(dispatch_mode={"dispatch_fn": dispatch_data, "collect_fn": collect_with_torch_cat})
    def generate_collected_with_torch_cat(self, data):
        out = DataProto.from_dict({"x": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)})
        out.meta_info["metrics"] = {"rank": self.rank}
        return out

    @register(dispatch_mode={"dispatch_fn": dispatch_first_only, "collect_fn": collect_data})
    def generate_with_two_arguments(self, data, scale):
        return data

    @register(dispatch_mode={"dispatch_fn": dispatch_whole, "collect_fn": collect_data})
    def generate_unsplit(self, data):
        return data

    @register(dispatch_mode={"dispatch_fn": dispatch_one_chunk, "collect_fn": collect_data})
    def generate_one_chunk(self, data):
        return data

    @register(dispatch_mode={"dispatch_fn": dispatch_bad_kwargs, "collect_fn": collect_data})
    def generate_bad_kwargs(self, data, scale):
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def infer(self, data):
        return DataProto.from_dict({"ref_log_prob": data.batch["x"].float() / 10})


# ---- a mode registered at import and named as a Dispatch attribute, built on the registry ------------

_proto_mode = DISPATCH_MODE_FN_REGISTRY[Dispatch.DP_COMPUTE_PROTO]


def _split_like_dp_proto(worker_group, data):
    return _proto_mode["dispatch_fn"](worker_group, data)


def _sum_of_y(worker_group, outputs):
    return int(_proto_mode["collect_fn"](worker_group, outputs).batch["y"].sum())


register_dispatch_mode("VERL_PARITY_SUM", _split_like_dp_proto, _sum_of_y)


class MeshWorker(Worker):
    """Registers its place in a 2 (DP) x 2 mesh the low-level way: DP rank = rank // 2, rank 2d collects."""

    def __init__(self, offset: int = 0) -> None:
        super().__init__()
        self.offset = offset
        self._register_dispatch_collect_info("train", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("train"))
    def compute(self, data):
        return DataProto.from_dict({"x": data.batch["x"], "producer": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.VERL_PARITY_SUM)
    def add_offset(self, data):
        return DataProto.from_dict({"y": data.batch["x"] + self.offset})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, tag=""):
        return {"rank": self.rank, "tag": tag, "pid": os.getpid()}

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.ALL)
    def plus_rank(self, value, scale=1):
        return (value + self.rank) * scale

    def plain_method(self, value):
        return value * 10 + self.rank


# ---- roles of a fused actor -------------------------------------------------------------------------


class ActorRole(Worker):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self):
        critic = self.get_fused_worker_by_name("critic")
        return {"role": "actor", "rank": self.rank, "pid": os.getpid(), "critic_value": critic.value}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def scaled_lr(self, factor):
        await asyncio.sleep(0)
        return self.lr * factor

    def learning_rate(self):
        return self.lr


class CriticRole(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.value = 7

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self):
        return {"role": "critic", "rank": self.rank, "pid": os.getpid()}


# ---- a worker ported from verl's TensorDict-era workers -----------------------------------------------


class InnerEngine(Worker):
    """Built inside PortedWorker (not an actor), as verl's engine workers build their TrainingWorker: both
    ranks are DP rank 0 of mesh "train", and only rank 0's output is collected."""

    def __init__(self) -> None:
        super().__init__()
        self._register_dispatch_collect_info("train", dp_rank=0, is_collect=self.rank == 0)


class PortedWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.engine = InnerEngine()
        self.set_dispatch_collect(mesh_name="actor", **self.engine.get_dispatch_collect())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def score_td(self, td):
        turns = [len(turn_list) for turn_list in td["turn_scores"]]
        out = TensorDict(
            {"doubled": td["x"] * 2, "rank": torch.full((len(td),), self.rank), "turns": torch.tensor(turns)},
            batch_size=[len(td)],
        )
        out["temperature"] = NonTensorData(td["temperature"])
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count_rows_td(self, td):
        return {"rank": self.rank, "rows": len(td)}

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_on_mesh(self, td):
        return TensorDict({"x": td["x"], "producer": torch.full((len(td),), self.rank)}, batch_size=[len(td)])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def dispatch_collect_info(self):
        return self.get_dispatch_collect()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_again(self):
        self.set_dispatch_collect("actor", {"train": 0}, {"train": True})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_conflicting(self):
        self.set_dispatch_collect("other", {"a": 0, "b": 1}, {"a": True, "b": True})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def async_identity(self, value):
        await asyncio.sleep(0)
        return {"rank": self.rank, "value": value}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    async def async_double(self, data):
        await asyncio.sleep(0)
        return DataProto.from_dict({"y": data.batch["x"] * 2, "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self, names):
        return {name: os.environ.get(name) for name in names}
