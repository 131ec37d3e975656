"""Trainer -> rollout weight sync: bucketed (our path) vs one transfer per tensor, against a baseline.

    python -m benchmarks.weight_sync [--sizes 0.5B,1.5B,7B] [--paths ipc,broadcast] [--out outputs/bench/weight_sync.json]

Random weights with the Hugging Face names and shapes of Qwen2 0.5B / 1.5B / 7B move from a sender actor
(the trainer) to a receiver actor (the engine), which copies them into its own tensors of the same names.
- ipc (CUDA, both actors on one GPU): `IpcStagingBuffers` -> `IpcReceiver`, one Ray call per bucket, vs one
  `ipc_handle` + Ray call per tensor. Baseline: a device memcpy of one buffer of the same bytes.
- broadcast (gloo on CPU, NCCL with --device cuda and 2 GPUs): a `WeightSyncGroup` of 2, one broadcast per
  packed bucket vs one per tensor. Baseline: one broadcast of one buffer of the same bytes, same group.
`pack_only` rows time the sender's packing alone. Each figure is the median of --reps after one warm-up;
the receiver's tensors are zeroed before the warm-up and compared with the sender's (checksums) after it.
On CPU --sizes defaults to 0.5B: 7B would need ~15 GB of weights, and as much again for the baseline's one
buffer, in each of the two processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from single_controller.ray.local_cluster import init_local_ray  # noqa: E402
from workers.rollout.buckets import pack_bucket, plan_buckets  # noqa: E402
from workers.rollout.sync_group import SyncGroupAddress, WeightSyncGroup  # noqa: E402
from workers.rollout.weight_sync import (  # noqa: E402
    BroadcastSender,
    IpcReceiver,
    IpcStagingBuffers,
    broadcast_buckets,
    gathered_buckets,
    ipc_handle,
    open_ipc_handle,
    receive_broadcast_buckets,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
Spec = list[tuple[str, tuple[int, ...]]]
# (hidden, intermediate, layers, heads, kv heads, head_dim, vocab, tied embeddings)
QWEN2 = {
    "0.5B": (896, 4864, 24, 14, 2, 64, 151936, True),
    "1.5B": (1536, 8960, 28, 12, 2, 128, 151936, True),
    "7B": (3584, 18944, 28, 28, 4, 128, 152064, False),
}
INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def qwen2_spec(size: str) -> Spec:
    """`(name, shape)` of a Qwen2ForCausalLM's parameters, in `named_parameters` order."""
    hidden, inter, layers, heads, kv_heads, head_dim, vocab, tied = QWEN2[size]
    q, kv = heads * head_dim, kv_heads * head_dim
    spec: Spec = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        spec += [
            (p + "self_attn.q_proj.weight", (q, hidden)), (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.weight", (kv, hidden)), (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, hidden)), (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (hidden, q)),
            (p + "mlp.gate_proj.weight", (inter, hidden)), (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
            (p + "input_layernorm.weight", (hidden,)), (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    spec.append(("model.norm.weight", (hidden,)))
    if not tied:
        spec.append(("lm_head.weight", (vocab, hidden)))
    return spec


def checksum(t: torch.Tensor) -> tuple[int, int]:
    """Exact integer sums of the raw bits (all elements, every 7th): order-independent on both sides, and a
    shifted or permuted copy changes the second one."""
    bits = t.reshape(-1).view(INT_OF_SIZE[t.element_size()])
    return int(bits.sum(dtype=torch.int64)), int(bits[::7].sum(dtype=torch.int64))


class NamedTensors:
    """Plain tensors behind the one `nn.Module` method the weight-sync gathers read."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def named_parameters(self) -> Any:
        return iter(self.tensors.items())


@ray.remote
class Endpoint:
    """One side of the sync: the sender holds random weights, the receiver zeros of the same names."""

    def __init__(self, spec: Spec, dtype: str, device: str, bucket_bytes: int, sender: bool) -> None:
        self.device = torch.device(device, 0) if device == "cuda" else torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dt = getattr(torch, dtype)
        gen = torch.Generator(device=self.device).manual_seed(0)
        self.tensors = {
            name: torch.randn(shape, dtype=dt, device=self.device, generator=gen) if sender
            else torch.zeros(shape, dtype=dt, device=self.device)
            for name, shape in spec
        }
        self.weights = cast(nn.Module, NamedTensors(self.tensors))  # what the sync functions take
        self.layouts = plan_buckets(((name, shape, dt) for name, shape in spec), bucket_bytes)
        self.nbytes = sum(t.nbytes for t in self.tensors.values())
        self.group: WeightSyncGroup | None = None
        self.flat: torch.Tensor | None = None
        self.sender = BroadcastSender(self.device)  # staging buffers kept across syncs, as the actor keeps them

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _timed(self, fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        fn()
        self._sync()
        return time.perf_counter() - start

    def checksums(self) -> dict[str, tuple[int, int]]:
        return {name: checksum(t) for name, t in self.tensors.items()}

    def zero(self) -> None:
        for t in self.tensors.values():
            t.zero_()
        self._sync()

    def info(self) -> tuple[int, int]:
        return self.nbytes, len(self.layouts)

    # ---- CUDA IPC: sender methods drive a whole sync, the receiver answers one call per bucket/tensor ----
    def memcpy_seconds(self, reps: int) -> float:
        buffers = [torch.empty(self.nbytes, dtype=torch.uint8, device=self.device) for _ in range(2)]
        times = [self._timed(lambda: buffers[1].copy_(buffers[0])) for _ in range(reps + 1)][1:]
        buffers.clear()
        torch.cuda.empty_cache()  # the 2 x model-size baseline buffers must not crowd the syncs
        return statistics.median(times)

    def ipc_share(self, receiver: Any) -> None:
        self.staging = IpcStagingBuffers(self.layouts, self.device)
        ray.get(receiver.ipc_open.remote(self.staging.handles))

    def ipc_bucketed(self, receiver: Any) -> float:
        def deliver(index: int, layout: Any) -> Callable[[], Any]:
            ref = receiver.ipc_load.remote(index, layout)
            return lambda: ray.get(ref)

        buckets = gathered_buckets(self.weights, self.layouts)
        return self._timed(lambda: self.staging.send(buckets, deliver))

    def ipc_pack_only(self) -> float:
        buckets = gathered_buckets(self.weights, self.layouts)
        return self._timed(lambda: self.staging.send(buckets, lambda index, layout: lambda: None))

    def ipc_per_parameter(self, receiver: Any) -> float:
        def run() -> None:
            for name, t in self.tensors.items():
                ray.get(receiver.ipc_load_one.remote(name, ipc_handle(t)))

        return self._timed(run)

    def ipc_open(self, handles: list[Any]) -> None:
        self.ipc = IpcReceiver(handles, self.device)

    def ipc_load(self, index: int, layout: Any) -> None:
        for name, view in self.ipc.bucket(index, layout):
            self.tensors[name].copy_(view)
        torch.cuda.current_stream().synchronize()  # the sender reuses the buffer once this call returns

    def ipc_load_one(self, name: str, handle: Any) -> None:
        self.tensors[name].copy_(open_ipc_handle(handle, self.device))
        torch.cuda.current_stream().synchronize()

    # ---- broadcast: both ranks run `broadcast(mode)` at once; rank 0 sends ----
    def host(self, backend: str) -> SyncGroupAddress:
        self.group = WeightSyncGroup()
        return self.group.host_store(2, backend)

    def connect(self, address: SyncGroupAddress, rank: int) -> None:
        self.group = self.group or WeightSyncGroup()
        self.group.connect(address, rank)

    def broadcast(self, mode: str) -> float:
        group = self.group
        assert group is not None
        # Barrier: Ray may start the two calls at different times; only the transfer is timed.
        group.broadcast(torch.zeros(1, device=self.device))
        if mode == "baseline":
            if self.flat is None:
                self.flat = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            return self._timed(lambda: group.broadcast(self.flat))
        if mode == "per_parameter":  # both sides broadcast straight from/into their tensors
            return self._timed(lambda: [group.broadcast(t) for t in self.tensors.values()])

        def bucketed() -> None:
            if group.rank == 0:
                broadcast_buckets(self.weights, self.layouts, group, self.device, sender=self.sender)
            else:  # the engine copies each received view into its own tensor
                for name, view in receive_broadcast_buckets(self.layouts, group, self.device):
                    self.tensors[name].copy_(view)

        return self._timed(bucketed)

    def pack_only(self) -> float:
        def pack() -> None:  # broadcast_buckets without the broadcasts; one packed bucket alive at a time
            for layout, tensors in gathered_buckets(self.weights, self.layouts):
                pack_bucket(layout, tensors, self.device)

        return self._timed(pack)


def median_after_warmup(run: Callable[[], float], reps: int, check: Callable[[], None]) -> float:
    """`check` runs after the warm-up (the receiver was zeroed before it)."""
    run()
    check()
    return statistics.median(run() for _ in range(reps))


def bench_size(size: str, args: argparse.Namespace, paths: list[str]) -> list[dict]:
    spec = qwen2_spec(size)
    params = sum(torch.Size(shape).numel() for _, shape in spec)
    rows: list[dict] = []

    def pair(num_gpus: float) -> tuple[Any, Any]:
        opts = {"num_cpus": 1, "num_gpus": num_gpus}
        make = lambda sender: Endpoint.options(**opts).remote(spec, args.dtype, args.device, args.bucket_mb * MIB, sender)
        return make(True), make(False)

    def checker(sender: Any, receiver: Any, what: str) -> Callable[[], None]:
        def check() -> None:
            want, got = ray.get([sender.checksums.remote(), receiver.checksums.remote()])
            bad = [name for name in want if want[name] != got[name]]
            assert not bad, f"{size} {what}: {len(bad)} tensors differ after the sync, e.g. {bad[:3]}"
        return check

    def add(path: str, backend: str, mode: str, seconds: float, base: float, nbytes: int, buckets: int) -> None:
        rows.append({"size": size, "params": params, "gb": nbytes / 1e9, "path": path, "backend": backend,
                     "mode": mode, "seconds": seconds, "gb_per_s": nbytes / 1e9 / seconds,
                     "pct_of_baseline": 100 * base / seconds, "buckets": buckets})

    for path in paths:
        gpus = 0.5 if path == "ipc" else (1 if args.device == "cuda" else 0)
        sender, receiver = pair(gpus)
        nbytes, buckets = ray.get(sender.info.remote())
        print(f"{size}: {params / 1e6:.1f}M parameters, {nbytes / 1e9:.2f} GB, {buckets} buckets of <= {args.bucket_mb} MiB, path {path}", flush=True)
        if path == "ipc":
            base = ray.get(sender.memcpy_seconds.remote(args.reps))
            ray.get(sender.ipc_share.remote(receiver))
            runs = {"bucketed": lambda: ray.get(sender.ipc_bucketed.remote(receiver)),
                    "per_parameter": lambda: ray.get(sender.ipc_per_parameter.remote(receiver))}
            backend, pack = "cuda_ipc", lambda: ray.get(sender.ipc_pack_only.remote())
        else:
            backend = "nccl" if args.device == "cuda" else "gloo"
            address = ray.get(sender.host.remote(backend))
            ray.get([receiver.connect.remote(address, 1), sender.connect.remote(address, 0)])
            both = lambda mode: lambda: max(ray.get([receiver.broadcast.remote(mode), sender.broadcast.remote(mode)]))
            base = median_after_warmup(both("baseline"), args.reps, lambda: None)
            runs = {"bucketed": both("bucketed"), "per_parameter": both("per_parameter")}
            pack = lambda: ray.get(sender.pack_only.remote())
        add(path, backend, "baseline", base, base, nbytes, 1)
        for mode, run in runs.items():
            ray.get(receiver.zero.remote())
            add(path, backend, mode, median_after_warmup(run, args.reps, checker(sender, receiver, f"{path} {mode}")),
                base, nbytes, buckets if mode == "bucketed" else len(spec))
        add(path, backend, "pack_only", median_after_warmup(pack, args.reps, lambda: None), base, nbytes, buckets)
        for actor in (receiver, sender):  # the receiver first: it maps the sender's IPC buffers
            ray.kill(actor)
    return rows


BUCKETED_TARGET_PCT = 60.0  # bucketed sync vs one broadcast of one buffer of the same bytes (issue 18)


def print_ratios(rows: list[dict]) -> None:
    """The bucketed broadcast against the raw one-buffer broadcast measured in the same run."""
    for r in rows:
        if r["path"] == "broadcast" and r["mode"] == "bucketed":
            verdict = "met" if r["pct_of_baseline"] >= BUCKETED_TARGET_PCT else "missed"
            print(f"{r['size']}: bucketed broadcast = {r['pct_of_baseline']:.1f}% of one raw broadcast of the same bytes "
                  f"(target >= {BUCKETED_TARGET_PCT:.0f}%: {verdict})")


def print_table(rows: list[dict]) -> None:
    header = f"{'size':>5} {'params':>8} {'GB':>6} {'path':>9} {'backend':>8} {'mode':>13} {'seconds':>8} {'GB/s':>7} {'% base':>7}"
    print("\n" + header)
    for r in rows:
        print(f"{r['size']:>5} {r['params'] / 1e6:>7.0f}M {r['gb']:>6.2f} {r['path']:>9} {r['backend']:>8} {r['mode']:>13} "
              f"{r['seconds']:>8.3f} {r['gb_per_s']:>7.2f} {r['pct_of_baseline']:>6.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/bench/weight_sync.json")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default=None, help="comma list of 0.5B,1.5B,7B (default: all three on cuda, 0.5B on cpu)")
    parser.add_argument("--paths", default="ipc,broadcast", help="comma list of ipc,broadcast")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions after one warm-up (median reported)")
    args = parser.parse_args()
    sizes = (args.sizes or ("0.5B,1.5B,7B" if args.device == "cuda" else "0.5B")).split(",")
    unknown = [s for s in sizes if s not in QWEN2]
    if unknown:
        parser.error(f"unknown sizes {unknown}; known: {list(QWEN2)}")
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    paths = []
    for path in args.paths.split(","):
        if path == "ipc" and args.device != "cuda":
            print("skipping ipc: CUDA IPC needs --device cuda")
        elif path == "broadcast" and args.device == "cuda" and gpus < 2:
            print(f"skipping broadcast: NCCL needs 2 GPUs, found {gpus}")
        elif path in ("ipc", "broadcast"):
            paths.append(path)
        else:
            parser.error(f"unknown path {path!r}")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])), "RAY_AUTH_MODE": "disabled",
           "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}  # no NVLink multicast on shared GPU hosts
    init_local_ray(num_cpus=4, object_store_memory=1 << 30, runtime_env={"env_vars": env})
    rows = [row for size in sizes for row in bench_size(size, args, paths)]
    print_table(rows)
    print_ratios(rows)
    result = {
        "machine": {"torch": torch.__version__, "ray": ray.__version__, "platform": platform.platform(), "cpus": os.cpu_count(),
                    "device": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu", "gpus": gpus},
        "command": shlex.join([sys.executable, "-m", "benchmarks.weight_sync", *sys.argv[1:]]),
        "settings": {"sizes": sizes, "paths": paths, "dtype": args.dtype, "bucket_mb": args.bucket_mb, "reps": args.reps},
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"\nwrote {args.out}")
    ray.shutdown()


if __name__ == "__main__":
    main()
