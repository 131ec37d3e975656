"""What one NCCL communicator holds on each GPU (NVML, device-wide), the first and each further one: an input of the
memory plan, where a tensor-parallel engine's shards run inside the trainer processes and bring their
communicators there (workers/rollout/engine_shards.py).

    python -m benchmarks.nccl_comm_memory --gpus 2 --communicators 4 --out nccl_comm_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GIB = float(1 << 30)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _used(device: torch.device) -> float:
    torch.cuda.synchronize(device)
    return torch.cuda.device_memory_used(device) / GIB


def _rank_main(rank: int, world: int, port: int, communicators: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    torch.ones(1, device=device)  # the CUDA context first: it is not the communicator's
    readings = {"context": _used(device)}
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    groups = [dist.group.WORLD] + [dist.new_group(list(range(world))) for _ in range(communicators - 1)]
    for index, group in enumerate(groups):
        dist.all_reduce(torch.ones(1 << 20, device=device), group=group)  # NCCL makes a communicator at first use
        readings[f"communicator_{index + 1}"] = _used(device)
    dist.barrier()
    results[rank] = readings
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--communicators", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_main, args=(args.gpus, _free_port(), args.communicators, results), nprocs=args.gpus)
        readings = dict(results)
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    report = {"gpu": torch.cuda.get_device_name(0), "gpus": args.gpus, "nccl": nccl, "torch": torch.__version__,
              "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
              "per_rank_gib": readings}
    for rank, values in sorted(readings.items()):
        steps = list(values.values())
        deltas = [round(b - a, 3) for a, b in zip(steps, steps[1:])]
        print(f"rank {rank}: context {steps[0]:.2f} GiB, each communicator adds {deltas} GiB")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    main()
