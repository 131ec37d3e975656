"""Offload at the copy engine's speed: pinned host<->device bandwidth, and the offloader's round trips on a real
FSDP2 model, with the overhead as a multiple of bytes / bandwidth.

    python -m benchmarks.offload [--shape 1.5B] [--round-trips 5] [--probe-gib 4] [--no-optimizer]
        [--fsdp-cpu-offload] [--json [results/offload.json]]
    python -m benchmarks.offload --probe-only --json /tmp/bandwidth.json   # the bandwidth alone (scale_step uses it)

1. Bandwidth: a page-locked host buffer (registered as the offloader registers its own) and a device buffer
   of `--probe-gib`, copied each way; best of 3, timed with CUDA events.
2. A random-init Qwen2 of `--shape` built on the GPU from a config (float32 master weights, each decoder
   layer and the root sharded with FSDP2 and bf16 compute, as the actor holds it), one AdamW step so the
   optimizer's state exists (`--no-optimizer`: parameters only).
3. `--round-trips` offload/load round trips with workers/fsdp/offload.py: bytes, seconds, GB/s and
   overhead = seconds / (bytes / bandwidth) per direction; the first round trip (host buffers allocated and
   page-locked) is reported apart. Afterwards every tensor's bit-sum and a forward's logits are compared
   with those before the round trips.
4. `--fsdp-cpu-offload`: the alternative, FSDP2's CPUOffloadPolicy(pin_memory=True) (parameters live on the
   host, copied in at every unshard; the optimizer steps on the CPU), against load + step + offload with
   the offloader, on the same batch.

`--shape tiny` runs on CPU (host-to-host copies), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.model_shapes import QWEN2_1_5B, QWEN2_7B
from workers.fsdp.storage_offload import HostBuffer

GB = 1e9
SHAPES = {
    "1.5B": QWEN2_1_5B,
    "7B": QWEN2_7B,
    "tiny": dict(QWEN2_1_5B, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 intermediate_size=256, vocab_size=1000, tie_word_embeddings=False),
}


@dataclass
class Bandwidth:
    h2d_gbps: float
    d2h_gbps: float
    probe_bytes: int
    device: str

    def seconds_for(self, h2d_bytes: int, d2h_bytes: int) -> float:
        """The time the bytes need at this bandwidth."""
        return h2d_bytes / (self.h2d_gbps * GB) + d2h_bytes / (self.d2h_gbps * GB)


def _timed_copy(dst: torch.Tensor, src: torch.Tensor, on_cuda: bool) -> float:
    if not on_cuda:
        start = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - start
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000


def probe_bandwidth(device: torch.device, gib: float, repeats: int = 3) -> Bandwidth:
    """Best-of-`repeats` copies of `gib` between page-locked host memory and the device (on CPU: host to host)."""
    on_cuda = device.type == "cuda"
    nbytes = int(gib * (1 << 30))
    host = HostBuffer(nbytes, pin=on_cuda)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    target.fill_(1)
    host.data.fill_(2)
    h2d = min(_timed_copy(target, host.data, on_cuda) for _ in range(repeats))
    d2h = min(_timed_copy(host.data, target, on_cuda) for _ in range(repeats))
    del target
    host.release()
    if on_cuda:
        torch.cuda.empty_cache()
    name = torch.cuda.get_device_name(device) if on_cuda else "cpu"
    return Bandwidth(nbytes / h2d / GB, nbytes / d2h / GB, nbytes, name)


# ---- the model ----------------------------------------------------------------------------------------
def sharded_model(shape: dict[str, Any], device: torch.device) -> torch.nn.Module:
    """Random-init Qwen2, float32 master weights, each decoder layer and the root sharded (bf16 compute on GPU)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**shape))
    return shard(model, device)


def shard(model: torch.nn.Module, device: torch.device, **policies: Any) -> torch.nn.Module:
    """FSDP2 as workers/fsdp/model_loading.py applies it (imports kept light: the script runs on a bare GPU box)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": init_device_mesh(device.type, (torch.distributed.get_world_size(),)), **policies}
    if device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def batch(model: torch.nn.Module, device: torch.device, rows: int = 2, length: int = 256) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (rows, length), generator=generator).to(device)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor) -> None:
    logits = model(input_ids=ids).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def bit_sums(tensors: list[torch.Tensor]) -> list[int]:
    """Per tensor, the sum of its elements' bit patterns (integers: exact)."""
    from torch.distributed.tensor import DTensor

    views = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
    sums = []
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        sums.append(int(local.detach().contiguous().view(views[local.element_size()]).sum(dtype=torch.int64)))
    return sums


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the round trips ----------------------------------------------------------------------------------
def round_trips(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device, count: int,
                bandwidth: Bandwidth) -> dict[str, Any]:
    from workers.fsdp.offload import Offloader

    offloader = Offloader(model, optimizer, device, True, optimizer is not None, move_on_cpu=True)
    tensors = [*model.parameters(), *(v for s in (optimizer.state.values() if optimizer else []) for v in s.values())]
    sums_before = bit_sums(tensors)
    ids = batch(model, device)
    with torch.no_grad():
        logits_before = model(input_ids=ids).logits.float().cpu()
    trips = []
    allocated = {}
    for _ in range(count):
        synchronize(device)
        allocated["resident"] = _allocated_gib(device)
        start = time.perf_counter()
        offloader.offload()
        synchronize(device)
        offloaded = time.perf_counter()
        allocated["offloaded"] = _allocated_gib(device)
        offloader.load(with_optimizer=optimizer is not None)
        synchronize(device)
        loaded = time.perf_counter()
        transfer = offloader.take_transfer()
        trips.append(_trip(transfer.d2h_bytes, transfer.h2d_bytes, offloaded - start, loaded - offloaded,
                           transfer.host_alloc_s, bandwidth))
    with torch.no_grad():
        logits_after = model(input_ids=ids).logits.float().cpu()
    return {
        "trips": trips,
        "state_unchanged": bit_sums(tensors) == sums_before,
        "forward_unchanged": torch.equal(logits_before, logits_after),
        "host_allocations": offloader.host_allocations,
        "host_gib": offloader.host_bytes / 2**30,
        "allocated_gib": allocated,  # the device allocator's bytes (GPU): resident, offloaded
    }


def _allocated_gib(device: torch.device) -> float | None:
    return torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _trip(
    d2h: int, h2d: int, offload_s: float, load_s: float, alloc_s: float, bandwidth: Bandwidth
) -> dict[str, float]:
    ideal_d2h, ideal_h2d = bandwidth.seconds_for(0, d2h), bandwidth.seconds_for(h2d, 0)
    return {
        "d2h_gib": d2h / 2**30, "h2d_gib": h2d / 2**30, "offload_s": offload_s, "load_s": load_s,
        "host_alloc_s": alloc_s, "d2h_gbps": d2h / offload_s / GB, "h2d_gbps": h2d / load_s / GB,
        "offload_overhead": offload_s / ideal_d2h, "load_overhead": load_s / ideal_h2d,
        "overhead": (offload_s + load_s) / (ideal_d2h + ideal_h2d),
    }


# ---- FSDP2's own CPU offload, for comparison -----------------------------------------------------------
def compare_fsdp_cpu_offload(shape: dict[str, Any], device: torch.device, steps: int = 3) -> dict[str, float]:
    """Seconds per training step (forward, backward, AdamW step) of (a) the offloader: load everything, step,
    offload everything; (b) FSDP2's CPUOffloadPolicy(pin_memory=True): parameters copied in at each unshard,
    the optimizer stepping on the host. Best of `steps` after a warm-up step."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from workers.fsdp.offload import Offloader

    results = {}
    model = sharded_model(shape, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    ids = batch(model, device)
    offloader = Offloader(model, optimizer, device, True, True, move_on_cpu=True)
    offloader.optimizer_only_in_steps()
    times = []
    for _ in range(steps + 1):
        synchronize(device)
        start = time.perf_counter()
        offloader.load_params()
        train_step(model, optimizer, ids)
        offloader.offload_params()
        synchronize(device)
        times.append(time.perf_counter() - start)
    results["offloader_step_s"] = min(times[1:])
    del model, optimizer, offloader
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**shape))  # on the host: the policy keeps the shards there
    shard(model, device, offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)  # host parameters: the host's AdamW
    times = []
    for _ in range(steps + 1):
        synchronize(device)
        start = time.perf_counter()
        train_step(model, optimizer, ids)
        synchronize(device)
        times.append(time.perf_counter() - start)
    results["fsdp_cpu_offload_step_s"] = min(times[1:])
    return results


# ---- for other benchmarks ------------------------------------------------------------------------------
def probe_in_subprocess(gib: float = 4.0) -> Bandwidth | None:
    """The pinned bandwidth measured by a child process (the caller keeps no CUDA context nor memory); None
    without a GPU."""
    if not torch.cuda.is_available():
        return None
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bandwidth.json"
        command = [sys.executable, "-m", "benchmarks.offload", "--probe-only", "--probe-gib", str(gib),
                   "--json", str(out)]
        subprocess.run(command, check=True)
        return Bandwidth(**json.loads(out.read_text())["bandwidth"])


# The actor worker's phases in the order of a step (others follow, in the order seen).
STEP_ORDER = ["init", "sync", "generate", "old_log_prob", "ref_log_prob", "update_actor", "save_checkpoint"]


def offload_table(history: list[dict[str, float]], bandwidth: Bandwidth | None) -> list[dict[str, Any]]:
    """Per phase of the workers' `offload/<phase>/...` metrics (steady state: mean of steps 2..N): GiB each
    way, seconds spent moving, the seconds the bytes need at `bandwidth` and the multiple."""
    phases: list[str] = []
    for record in history:
        for key in record:
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "offload" and parts[2] == "seconds" and parts[1] not in phases:
                phases.append(parts[1])
    phases.sort(key=lambda p: STEP_ORDER.index(p) if p in STEP_ORDER else len(STEP_ORDER))
    table = []
    for phase in phases:
        row: dict[str, Any] = {"phase": phase}
        for way in ("h2d_gib", "d2h_gib", "seconds"):
            row[way] = _steady(history, f"offload/{phase}/{way}")
        ideal = bandwidth.seconds_for(int(row["h2d_gib"] * 2**30), int(row["d2h_gib"] * 2**30)) if bandwidth else None
        row["ideal_s"] = ideal
        row["overhead"] = row["seconds"] / ideal if ideal else None
        table.append(row)
    return table


def _steady(history: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in history[1:] if key in r] or [r[key] for r in history if key in r]
    return sum(values) / len(values) if values else 0.0


def print_offload_table(table: list[dict[str, Any]], bandwidth: Bandwidth | None) -> None:
    if not table:
        return
    where = "no bandwidth measured (CPU: nothing moves)"
    if bandwidth:
        where = (f"pinned bandwidth {bandwidth.h2d_gbps:.1f} / {bandwidth.d2h_gbps:.1f} GB/s "
                 "(host->device / back), this run")
    print(f"  offload per phase (steady), {where}")
    print("  phase                   h2d GiB   d2h GiB   seconds   bytes/bandwidth s   x")
    for row in table:
        ideal = f"{row['ideal_s']:.2f}" if row["ideal_s"] is not None else "-"
        multiple = f"{row['overhead']:.2f}" if row["overhead"] is not None else "-"
        print(f"  {row['phase'].ljust(22)}{row['h2d_gib']:10.2f}{row['d2h_gib']:10.2f}{row['seconds']:10.2f}"
              f"{ideal:>20}{multiple:>6}")
    seconds, ideal = sum(r["seconds"] for r in table), sum(r["ideal_s"] or 0 for r in table)
    ideal_text = f"{ideal:.2f}" if bandwidth else "-"
    multiple_text = f"{seconds / ideal:.2f}" if bandwidth and ideal else "-"
    print(f"  {'all phases'.ljust(22)}{sum(r['h2d_gib'] for r in table):10.2f}{sum(r['d2h_gib'] for r in table):10.2f}"
          f"{seconds:10.2f}{ideal_text:>20}{multiple_text:>6}")


# ---- main ---------------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    from workers.training.dist_utils import single_process_group

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cpu" and args.shape != "tiny" and not args.probe_only:
        raise SystemExit(f"error: --shape {args.shape} needs a GPU; on CPU use --shape tiny")
    bandwidth = probe_bandwidth(device, args.probe_gib if device.type == "cuda" else min(args.probe_gib, 0.25))
    result: dict[str, Any] = {"bandwidth": asdict(bandwidth)}
    if args.probe_only:
        return result
    shape = SHAPES[args.shape]
    with single_process_group(device):
        model = sharded_model(shape, device)
        optimizer = None
        if not args.no_optimizer:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
            train_step(model, optimizer, batch(model, device))
        result["params"] = sum(p.numel() for p in model.parameters())
        result["round_trips"] = round_trips(model, optimizer, device, args.round_trips, bandwidth)
        del model, optimizer
        if args.fsdp_cpu_offload:
            result["fsdp_cpu_offload"] = compare_fsdp_cpu_offload(shape, device)
    result["shape"] = args.shape
    return result


def print_result(result: dict[str, Any]) -> None:
    bw = result["bandwidth"]
    print(f"{bw['device']}: page-locked host -> device {bw['h2d_gbps']:.1f} GB/s, "
          f"device -> host {bw['d2h_gbps']:.1f} GB/s ({bw['probe_bytes'] / 2**30:.1f} GiB, best of 3)")
    if "round_trips" not in result:
        return
    rt = result["round_trips"]
    print(f"{result['shape']}: {result['params'] / 1e6:,.0f} M parameters; host buffers {rt['host_gib']:.1f} GiB in "
          f"{rt['host_allocations']} allocation(s); state unchanged after the round trips: {rt['state_unchanged']}, "
          f"forward unchanged: {rt['forward_unchanged']}")
    if rt["allocated_gib"].get("resident") is not None:
        print(f"  device memory allocated: {rt['allocated_gib']['resident']:.2f} GiB resident, "
              f"{rt['allocated_gib']['offloaded']:.2f} GiB offloaded")
    print("  trip   d2h GiB   offload s   GB/s  x ideal   h2d GiB   load s   GB/s  x ideal   overhead   host alloc s")
    for index, t in enumerate(rt["trips"], 1):
        print(f"  {index:4d}{t['d2h_gib']:10.2f}{t['offload_s']:12.3f}{t['d2h_gbps']:7.1f}{t['offload_overhead']:9.2f}"
              f"{t['h2d_gib']:10.2f}{t['load_s']:9.3f}{t['h2d_gbps']:7.1f}{t['load_overhead']:9.2f}"
              f"{t['overhead']:11.2f}{t['host_alloc_s']:15.2f}")
    steady = rt["trips"][1:] or rt["trips"]
    print(f"  steady (trips 2..N): overhead {sum(t['overhead'] for t in steady) / len(steady):.2f} x bytes / bandwidth")
    if "fsdp_cpu_offload" in result:
        c = result["fsdp_cpu_offload"]
        print(f"  training step: offloader (load, step, offload) {c['offloader_step_s']:.2f} s; "
              f"FSDP2 CPUOffloadPolicy {c['fsdp_cpu_offload_step_s']:.2f} s")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1.5B", choices=list(SHAPES))
    parser.add_argument("--round-trips", type=int, default=5)
    parser.add_argument("--probe-gib", type=float, default=4.0)
    parser.add_argument("--no-optimizer", action="store_true", help="parameters only (no AdamW state)")
    parser.add_argument("--fsdp-cpu-offload", action="store_true", help="also time FSDP2's CPUOffloadPolicy")
    parser.add_argument("--probe-only", action="store_true", help="measure the bandwidth only")
    parser.add_argument("--json", nargs="?", const="results/offload.json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.round_trips < 1:
        parser.error(f"--round-trips must be >= 1, got {args.round_trips}")
    result = run(args)
    print_result(result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), **result}, indent=2))
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
