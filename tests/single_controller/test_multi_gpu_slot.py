"""A worker of a pool whose processes take 2 GPUs each sees both (a tensor-parallel vLLM engine starts one
process per GPU it sees). Ray on this machine has no GPUs, so a cluster of its own is started in a
subprocess with 4 logical ones: Ray's CUDA_VISIBLE_DEVICES for an actor follows the same rules then."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, ray
from single_controller import Dispatch, Worker, register
from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from single_controller.ray.local_cluster import init_local_ray

class Visible(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def devices(self):
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

init_local_ray(num_cpus=4, num_gpus=4, include_dashboard=False)
two = RayWorkerGroup(RayResourcePool([1], use_gpu=True, name_prefix="tp2_", gpus_per_process=2), RayClassWithInitArgs(Visible))
one = RayWorkerGroup(RayResourcePool([2], use_gpu=True, name_prefix="tp1_"), RayClassWithInitArgs(Visible))
print(json.dumps({"two": two.devices(), "one": one.devices()}))
"""


def test_a_two_gpu_process_sees_both_gpus(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), RAY_AUTH_MODE="disabled")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert [len(v.split(",")) for v in seen["two"]] == [2], seen
    assert [len(v.split(",")) for v in seen["one"]] == [1, 1] and len(set(seen["one"])) == 2, seen
