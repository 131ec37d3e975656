"""A process group outside torch.distributed's global state, joining a trainer rank and rollout engines.

The trainer already has its default group (FSDP) and each vLLM engine has its own; weight broadcast needs a
third group spanning trainer rank 0 and every engine worker. It is built from a `TCPStore` and the backend's
`ProcessGroup*` class directly, so it touches neither side's default group.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from single_controller.worker import node_ip_address

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class SyncGroupAddress:
    host: str
    port: int
    world_size: int
    backend: str

    def to_wire(self) -> list[Any]:
        """Plain values for vLLM's worker calls (its msgpack turns a dataclass into a dict)."""
        return [self.host, self.port, self.world_size, self.backend]

    @classmethod
    def from_wire(cls, wire: list[Any]) -> "SyncGroupAddress":
        return cls(*wire)


class WeightSyncGroup:
    """Rank 0 creates the store (`host_store`, on a free port the OS picks); every rank then calls
    `connect`, all at the same time (the backend's constructor is collective)."""

    def __init__(self) -> None:
        self._store: dist.TCPStore | None = None
        self._keep_store: dist.Store | None = None  # the group reads the store for as long as it lives
        self.group: dist.ProcessGroup | None = None
        self.rank = -1

    def host_store(self, world_size: int, backend: str, timeout_s: float = 300.0) -> SyncGroupAddress:
        if backend not in BACKENDS:
            raise ValueError(f"weight-sync backend must be one of {list(BACKENDS)}, got {backend!r}")
        host = node_ip_address()
        # Port 0: the kernel picks a free port at bind time, so no other process can take it between
        # choosing and binding.
        self._store = dist.TCPStore(
            host, 0, world_size, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        return SyncGroupAddress(host, self._store.port, world_size, backend)

    def connect(self, address: SyncGroupAddress, rank: int, timeout_s: float = 300.0) -> None:
        if not 0 <= rank < address.world_size:
            raise ValueError(f"rank {rank} outside the weight-sync group of {address.world_size}")
        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            if self._store is None:
                raise RuntimeError("rank 0 must call host_store() before connect()")
            store = self._store
        else:
            store = dist.TCPStore(address.host, address.port, address.world_size, is_master=False, timeout=timeout)
        prefixed = dist.PrefixStore("weight_sync/", store)
        if address.backend == "gloo":
            self.group = dist.ProcessGroupGloo(prefixed, rank, address.world_size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(prefixed, rank, address.world_size, options)
        self.rank = rank
        self._keep_store = store

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        """Blocking: on return the bytes are in `tensor` (receivers) / sent (root), host-visible."""
        self.broadcast_async(tensor, root).wait()
        if tensor.is_cuda:
            torch.cuda.current_stream().synchronize()

    def broadcast_async(self, tensor: torch.Tensor, root: int = 0) -> dist.Work:
        """Start a broadcast; `wait()` on the result before touching `tensor` again. With NCCL that wait only
        orders the current stream after the transfer (the host does not block); with gloo it blocks."""
        if self.group is None:
            raise RuntimeError("weight-sync group not connected; call connect() first")
        options = dist.BroadcastOptions()
        options.rootRank = root
        options.rootTensor = 0
        return self.group.broadcast([tensor], options)

    def close(self) -> None:
        self.group, self._store = None, None
        self._keep_store = None
