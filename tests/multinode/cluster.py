"""The test side of `cluster_host`: start a multi-node cluster in its own process, change its nodes, and
run drivers against it (each driver is its own process, attached with RAY_ADDRESS)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil

from tests.reliability.processes import REPO_ROOT, ChildProcess, child_env

START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
RESULT_PREFIX = "RESULT "
# Ray's own per-node processes; any other `ray::...` process is a worker holding an actor or task.
RAY_SERVICE_TITLES = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
HEAD_CPUS = 0  # the drivers' node: no worker process is placed on it
# One pool node of trainer.n_gpus_per_node=1 (1 CPU per process) per worker node: the trainer runs cross the nodes
# with one rank on each, half the CPU of two each (the suite is CPU-bound).
WORKER_CPUS = 1
# The placement and node-loss drivers' probes: two on each worker node, for the rank order and per-node checks.
PROBE_CPUS = WORKER_CPUS / 2


class MultiNodeCluster:
    """A head node plus worker nodes (`worker_cpus` CPUs each), all on 127.0.0.1, owned by one process."""

    def __init__(self, head_cpus: int, worker_cpus: list[int], log_path: Path) -> None:
        self._log = open(log_path, "w")
        spec = json.dumps({"head_cpus": head_cpus, "worker_cpus": worker_cpus})
        self.host = subprocess.Popen(
            [sys.executable, "-m", "tests.multinode.cluster_host", spec],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=REPO_ROOT,
            env=self._env(),
            text=True,
            start_new_session=True,
        )
        self._replies: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_replies, daemon=True).start()
        self.state = self._reply(START_TIMEOUT_S)

    @staticmethod
    def _env(**extra: str) -> dict[str, str]:
        # One machine: every node on loopback (see single_controller/ray/local_cluster.py).
        return child_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", **extra)

    def _read_replies(self) -> None:
        for line in self.host.stdout:
            self._replies.put(line)

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        try:
            return json.loads(self._replies.get(timeout=timeout_s))
        except queue.Empty:
            raise AssertionError(f"the cluster host did not answer within {timeout_s:.0f}s (log: {self._log.name})") from None

    def request(self, **request: Any) -> dict[str, Any]:
        self.host.stdin.write(json.dumps(request) + "\n")
        self.host.stdin.flush()
        self.state = self._reply(REQUEST_TIMEOUT_S)
        return self.state

    @property
    def address(self) -> str:
        return self.state["address"]

    @property
    def worker_nodes(self) -> list[str]:
        return list(self.state["workers"])

    def driver_env(self) -> dict[str, str]:
        return self._env(RAY_ADDRESS=self.address)

    def start_driver(self, args: list[str], log_path: Path) -> ChildProcess:
        """Start `python args...` attached to the cluster, its output going to `log_path`."""
        return ChildProcess(args, log_path, env=self.driver_env())

    def run_driver(self, args: list[str], timeout_s: float) -> tuple[dict[str, Any], str]:
        """Run `python args...` attached to the cluster; its `RESULT {json}` line and its whole output."""
        done = subprocess.run(
            [sys.executable, *args], cwd=REPO_ROOT, env=self.driver_env(), capture_output=True, text=True, timeout=timeout_s
        )
        output = done.stdout + done.stderr
        result = tagged_json(output, RESULT_PREFIX)
        assert done.returncode == 0 and result is not None, f"driver {args} exited {done.returncode}:\n{output[-6000:]}"
        return result, output

    def actor_processes(self) -> list[psutil.Process]:
        """The cluster's worker processes that hold an actor or run a task now (not Ray's own services)."""
        found = []
        for process in psutil.Process(self.host.pid).children(recursive=True):
            try:
                title = " ".join(process.cmdline())
            except psutil.Error:
                continue
            if title.startswith("ray::") and not title.startswith(RAY_SERVICE_TITLES):
                found.append(process)
        return found

    def stop(self) -> None:
        """Close the host's stdin (it shuts the cluster down), then make sure none of its processes is left."""
        try:
            descendants = psutil.Process(self.host.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        self.host.stdin.close()
        try:
            self.host.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.host.kill()
            self.host.wait(timeout=30)
        _, alive = psutil.wait_procs(descendants, timeout=20)
        for process in alive:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self._log.close()


def tagged_json(output: str, prefix: str) -> Any:
    """The JSON after `prefix` on the first line of `output` that starts with it, or None."""
    line = next((l for l in output.splitlines() if l.startswith(prefix)), None)
    return None if line is None else json.loads(line.removeprefix(prefix))


def driver_script(name: str) -> str:
    return os.path.join("tests", "multinode", name)


def listening_addresses(root_pid: int) -> set[tuple[str, str]]:
    """(process name, address) of every listening socket of `root_pid` and its descendants."""
    root = psutil.Process(root_pid)
    found = set()
    for process in [root, *root.children(recursive=True)]:
        try:
            found |= {(process.name(), c.laddr.ip) for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return found
