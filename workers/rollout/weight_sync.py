"""Trainer → rollout weight sync, one module for the three placements.

- in-process (the engine lives in the trainer's process): full parameters, gathered one bucket at a time
  with FSDP2's `full_tensor()`, are handed to the engine's loader as `(name, tensor)` pairs;
- CUDA IPC (same GPU, another process): each bucket is packed into one of two staging buffers that the
  engine mapped once; one call per bucket tells it which buffer and layout to load;
- broadcast (other devices): trainer rank 0 broadcasts each packed bucket over a `WeightSyncGroup`
  (NCCL on GPU, gloo on CPU) to every engine worker.

Every trainer rank must run the sender side (the gathers are collectives); only rank 0 sends.
Tensors are cast to the engine's dtype on the way. Names are the Hugging Face checkpoint names.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workers.rollout.buckets import BucketLayout, bucket_views, empty_bucket, plan_buckets
from workers.rollout.sync_group import WeightSyncGroup

if TYPE_CHECKING:
    from workers.rollout.verify import WeightFingerprint

# A hook turning the trainer's named parameters into the names/tensors the engine loads (e.g. a LoRA merge).
ExportHook = Callable[[str, torch.Tensor], torch.Tensor]
# What a sender sends: per bucket, its layout and the whole tensors of its slots, in order.
WeightBuckets = Iterator[tuple[BucketLayout, list[torch.Tensor]]]


def full_parameter(param: torch.Tensor) -> torch.Tensor:
    """The whole parameter on this rank: an FSDP2 DTensor is all-gathered, a plain tensor is returned."""
    full_tensor = getattr(param, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else param


def plan_model_buckets(
    module: nn.Module, dtype: torch.dtype, bucket_bytes: int, names: Collection[str] | None = None
) -> list[BucketLayout]:
    """Buckets of `module`'s parameters (global shapes, cast to `dtype`), in `named_parameters` order; only
    those in `names` when given (a LoRA sync: the adapter factors)."""
    wanted = None if names is None else set(names)
    specs = ((name, tuple(p.shape), dtype) for name, p in module.named_parameters() if wanted is None or name in wanted)
    return plan_buckets(specs, bucket_bytes)


def gathered_buckets(
    module: nn.Module, layouts: list[BucketLayout], export_hook: ExportHook | None = None, cast: bool = True
) -> WeightBuckets:
    """Per bucket, its full parameters cast to the layout's dtypes (collective: every trainer rank runs it).
    With `cast=False` they keep their own dtype (a packer casting while it copies saves one copy).
    Only one bucket's gathered tensors are alive at a time."""
    params = dict(module.named_parameters())
    for layout in layouts:
        tensors = []
        with torch.no_grad():
            for slot in layout.slots:
                full = full_parameter(params[slot.name].detach())
                if export_hook is not None:
                    full = export_hook(slot.name, full)
                tensors.append(full.to(slot.dtype) if cast else full)
        yield layout, tensors


def named_full_parameters(
    module: nn.Module, layouts: list[BucketLayout], export_hook: ExportHook | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The in-process path: `(name, full tensor)` pairs, bucket by bucket."""
    for layout, tensors in gathered_buckets(module, layouts, export_hook):
        yield from zip(layout.names, tensors)


def stream_buckets(pairs: Iterator[tuple[str, torch.Tensor]], layouts: list[BucketLayout]) -> WeightBuckets:
    """A stream of `(name, full tensor)` pairs (already in the layouts' dtypes) cut into the layouts' buckets; the
    stream must come in the layouts' order (they were planned in it). Draws one bucket's tensors at a time."""
    for layout in layouts:
        tensors = []
        for slot in layout.slots:
            name, tensor = next(pairs, (None, None))
            if name != slot.name:
                raise RuntimeError(f"weight sync: the stream gave {name!r} where the bucket plan has {slot.name!r}; "
                                   "the plan must follow the order the weights are streamed in")
            tensors.append(tensor)
        yield layout, tensors
    for name, _ in pairs:
        raise RuntimeError(f"weight sync: the stream gave {name!r} after every planned bucket was filled")


def copy_into(views: list[torch.Tensor], tensors: list[torch.Tensor]) -> None:
    """`views[i].copy_(tensors[i])` (casting) for a whole bucket: one fused launch per dtype on CUDA instead
    of one per tensor, which is what a bucket of a small model costs most."""
    for view, tensor in zip(views, tensors):
        if tuple(view.shape) != tuple(tensor.shape):
            raise ValueError(f"tensor of shape {tuple(tensor.shape)} does not fit its bucket slot {tuple(view.shape)}")
    torch._foreach_copy_(views, tensors)


def send_in_turns(
    buckets: WeightBuckets, count: int, start: Callable[[int, BucketLayout, list[torch.Tensor]], Callable[[], Any]]
) -> int:
    """Bucket i goes through staging buffer i % count: `start(buffer_index, layout, tensors)` packs it and starts
    its transfer, returning a function that waits for it. A buffer is refilled only after its previous transfer
    was waited for; every transfer is waited for at the end. Returns the bytes sent."""
    pending: list[Callable[[], Any] | None] = [None] * count
    sent = 0
    for index, (layout, tensors) in enumerate(buckets):
        slot = index % count
        if pending[slot] is not None:
            pending[slot]()
        pending[slot] = start(slot, layout, tensors)
        sent += layout.nbytes
    for wait in pending:
        if wait is not None:
            wait()
    return sent


class BroadcastSender:
    """Trainer rank 0's side of the broadcast path. Two staging buffers (each as large as the largest bucket
    seen) are kept across syncs, with their views per layout computed once: bucket i+1 is packed while
    bucket i is on the wire, and a buffer is refilled only after its own broadcast finished. There is no
    host synchronisation between buckets (on CUDA the waits are stream-ordered), only one at the end."""

    def __init__(self, device: torch.device, count: int = 2) -> None:
        self.device = device
        self.buffers: list[torch.Tensor | None] = [None] * count
        self._views: dict[tuple[int, BucketLayout], list[torch.Tensor]] = {}

    def _views_of(self, slot: int, layout: BucketLayout) -> list[torch.Tensor]:
        buffer = self.buffers[slot]
        if buffer is None or buffer.numel() < layout.nbytes:
            self.buffers[slot] = empty_bucket(layout, self.device)
            self._views = {key: views for key, views in self._views.items() if key[0] != slot}
        key = (slot, layout)
        if key not in self._views:
            self._views[key] = [view for _, view in bucket_views(self.buffers[slot], layout)]
        return self._views[key]

    def send(
        self,
        buckets: WeightBuckets,
        group: WeightSyncGroup,
        fingerprint: "WeightFingerprint | None" = None,
    ) -> int:
        """Broadcast every `(layout, tensors)` bucket from group rank 0; `fingerprint` (if given) takes in
        each packed tensor, i.e. the weights exactly as the engine receives them. Returns the bytes sent."""

        def start(slot: int, layout: BucketLayout, tensors: list[torch.Tensor]) -> Callable[[], Any]:
            views = self._views_of(slot, layout)
            copy_into(views, tensors)
            if fingerprint is not None:
                fingerprint.add(views)
            return group.broadcast_async(self.buffers[slot][: layout.nbytes], root=0).wait

        sent = send_in_turns(buckets, len(self.buffers), start)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return sent


def send_broadcast(
    buckets: WeightBuckets,
    group: WeightSyncGroup | None,
    device: torch.device,
    sender: BroadcastSender | None = None,
    fingerprint: "WeightFingerprint | None" = None,
) -> int:
    """Sender side of the broadcast path over `(layout, tensors)` buckets; `group` is the connected group on
    trainer rank 0 and None on the other ranks (they only take part in producing the buckets, e.g. FSDP
    gathers). Pass the same `sender` every sync to reuse its staging buffers. Returns the bytes sent."""
    if group is None:
        deque(buckets, maxlen=0)
        return 0
    return (sender or BroadcastSender(device)).send(buckets, group, fingerprint)


def broadcast_buckets(
    module: nn.Module,
    layouts: list[BucketLayout],
    group: WeightSyncGroup | None,
    device: torch.device,
    export_hook: ExportHook | None = None,
    sender: BroadcastSender | None = None,
    fingerprint: "WeightFingerprint | None" = None,
) -> int:
    """`send_broadcast` of a module's full parameters, gathered bucket by bucket (cast while packed)."""
    buckets = gathered_buckets(module, layouts, export_hook, cast=False)
    return send_broadcast(buckets, group, device, sender, fingerprint)


def receive_broadcast_buckets(
    layouts: list[BucketLayout], group: WeightSyncGroup, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """Receiver side: one new buffer per bucket (the engine's loader may keep views of it), read out as
    views. The next bucket's broadcast is already posted while the caller loads this one."""

    def post(layout: BucketLayout) -> tuple[torch.Tensor, Any]:
        buffer = empty_bucket(layout, device)
        return buffer, group.broadcast_async(buffer, root=0)

    posted = post(layouts[0]) if layouts else None
    for index, layout in enumerate(layouts):
        buffer, work = posted
        if index + 1 < len(layouts):
            posted = post(layouts[index + 1])
        work.wait()  # on CUDA: the loader's kernels (same stream) start after the bytes arrived
        yield from bucket_views(buffer, layout)


# ---- CUDA IPC ---------------------------------------------------------------------------------------------
def ipc_handle(buffer: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    """A picklable handle another process on the same GPU opens with `open_ipc_handle` (no copy)."""
    if not buffer.is_cuda:
        raise ValueError("CUDA IPC needs a CUDA tensor; on CPU use the in-process or broadcast path")
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(buffer)


def open_ipc_handle(handle: tuple[Any, tuple[Any, ...]], device: torch.device) -> torch.Tensor:
    """Map the sender's buffer into this process. The device index in the handle is the sender's; it is
    replaced by ours (both name the same physical GPU, possibly under different CUDA_VISIBLE_DEVICES)."""
    rebuild, args = handle
    args = list(args)
    args[6] = device.index if device.index is not None else torch.cuda.current_device()
    return rebuild(*args)


class IpcStagingBuffers:
    """Sender side: a few flat GPU buffers, each as large as the largest bucket, shared with the engine
    once (`handles`); every sync then reuses them, so a bucket costs one copy and one call, not a new
    IPC mapping. With two buffers the engine loads bucket i while the next one is packed."""

    def __init__(self, layouts: list[BucketLayout], device: torch.device, count: int = 2) -> None:
        capacity = max(layout.nbytes for layout in layouts)
        self.buffers = [torch.empty(capacity, dtype=torch.uint8, device=device) for _ in range(count)]
        self.handles = [ipc_handle(buffer) for buffer in self.buffers]

    def send(
        self,
        buckets: WeightBuckets,
        deliver: Callable[[int, BucketLayout], Callable[[], Any]],
    ) -> int:
        """Pack each bucket into a free buffer and `deliver(buffer_index, layout)`, which starts the
        engine's load and returns a function waiting for it (the buffer is reused only after that)."""

        def start(slot: int, layout: BucketLayout, tensors: list[torch.Tensor]) -> Callable[[], Any]:
            for (_, view), tensor in zip(bucket_views(self.buffers[slot], layout), tensors):
                view.copy_(tensor)
            torch.cuda.current_stream().synchronize()  # the bytes are in place before the engine reads
            return deliver(slot, layout)

        return send_in_turns(buckets, len(self.buffers), start)


def send_ipc_to_engines(
    staging: IpcStagingBuffers | None, buckets: WeightBuckets, engines: list[Any]
) -> int:
    """One train rank's part of a CUDA IPC sync: pack each bucket into `staging` and have every engine actor
    in `engines` (on this rank's GPU) load it in place through its `load_ipc_bucket`. A rank feeding no
    engine still produces the buckets (its part in collective gathers). Returns the bytes packed."""
    if not engines:
        deque(buckets, maxlen=0)
        return 0
    import ray

    def deliver(index: int, layout: BucketLayout) -> Callable[[], Any]:
        refs = [engine.load_ipc_bucket.remote(index, layout) for engine in engines]
        return lambda: ray.get(refs)

    return staging.send(buckets, deliver)


class IpcReceiver:
    """Engine side: the sender's staging buffers, mapped once."""

    def __init__(self, handles: list[Any], device: torch.device) -> None:
        self.buffers = [open_ipc_handle(handle, device) for handle in handles]

    def bucket(self, index: int, layout: BucketLayout) -> Iterator[tuple[str, torch.Tensor]]:
        return bucket_views(self.buffers[index], layout)
