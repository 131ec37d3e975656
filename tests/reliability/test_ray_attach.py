"""Attaching to a cluster with RAY_ADDRESS: nothing there gives one `error:` line (exit code 2) after
trainer.ray_connect_timeout_s, naming the address and what to check; Ctrl-C while waiting gives one
`interrupted:` line (exit code 130); a head started on loopback in Ray's one-machine mode is reached even by
a driver without that mode (Ray alone would dial the machine's address instead)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from single_controller.ray.attach import ClusterUnreachable, attach, wait_for_gcs
from tests.reliability.conftest import short_run
from tests.reliability.processes import REPO_ROOT, child_env, sigint_reaches_children
from tests.reliability.test_ray_job_submit import free_ports, kill_leftovers
from trainer.interrupts import EXIT_CODE


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port that refuses connections for the whole test: bound here on every address, never listening, so no
    other process (the session's Ray cluster included) can start listening there meanwhile."""
    with socket.socket() as held:
        held.bind(("", 0))
        yield held.getsockname()[1]


def test_nothing_listening_gives_up_after_the_timeout(refused_port):
    port = refused_port
    started = time.monotonic()
    with pytest.raises(ClusterUnreachable) as info:
        wait_for_gcs(f"127.0.0.1:{port}", 1.5)
    waited = time.monotonic() - started
    assert 1.4 < waited < 5, waited
    message = str(info.value)
    assert message.startswith(f"no Ray cluster answered at RAY_ADDRESS=127.0.0.1:{port}")
    assert "within 1.5 s" in message and f"`ray start --head --port {port}`" in message
    assert "env -u RAY_ADDRESS" in message and "firewall" in message and "trainer.ray_connect_timeout_s=1.5" in message


def test_a_dashboard_address_is_refused_at_once():
    with pytest.raises(ClusterUnreachable, match=r"RAY_ADDRESS=http://127.0.0.1:8265 is a dashboard address"):
        attach("http://127.0.0.1:8265", 30)


def _driver_env(**extra: str) -> dict[str, str]:
    env = child_env(**extra)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # as a user's shell has it: Ray's multi-machine default
    return env


@pytest.mark.slow
def test_unreachable_cluster_stops_with_one_error_line(small_assets, tmp_path, refused_port):
    port = refused_port
    overrides = short_run(small_assets, tmp_path, "trainer.ray_connect_timeout_s=3")
    env = _driver_env(RAY_ADDRESS=f"127.0.0.1:{port}")
    done = subprocess.run([sys.executable, "-m", "trainer.main", *overrides], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=env, timeout=180)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: no Ray cluster answered at RAY_ADDRESS=127.0.0.1:{port}"), done.stderr
    assert "within 3 s" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.slow
def test_ctrl_c_while_waiting_for_the_cluster(small_assets, tmp_path, refused_port):
    port = refused_port
    overrides = short_run(small_assets, tmp_path, "trainer.ray_connect_timeout_s=120")
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        env = _driver_env(RAY_ADDRESS=f"127.0.0.1:{port}")
        with sigint_reaches_children():  # the Ctrl-C below must reach the driver however the suite was started
            driver = subprocess.Popen([sys.executable, "-m", "trainer.main", *overrides], cwd=REPO_ROOT, stdout=out,
                                      stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "checkpoints and logs:" not in log.read_text() and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.2)
        time.sleep(5.0)  # in the wait for the cluster now (importing Ray before it takes seconds on a loaded machine)
        driver.send_signal(signal.SIGINT)
        returncode = driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    output = log.read_text()
    assert returncode == EXIT_CODE, output
    assert [line for line in output.splitlines() if line.startswith("interrupted:")] == [
        "interrupted: stopped at step 0; no checkpoint yet (a rerun starts at step 0)"
    ], output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output


HEAD = (
    "ray start --head --block --node-ip-address 127.0.0.1 --port {gcs} --include-dashboard=false "
    "--ray-client-server-port {client} --dashboard-agent-listen-port {agent} --num-cpus 3 --disable-usage-stats"
)
ATTACH = (
    "from trainer.config_loader import load_config\n"
    "from trainer.run_setup import init_ray\n"
    "init_ray(load_config(['trainer.ray_connect_timeout_s=60']))\n"
    "import ray\n"
    "print('attached', ray.get_runtime_context().gcs_address, ray.cluster_resources()['CPU'])\n"
)


@pytest.mark.slow
def test_a_loopback_head_is_reached_by_a_driver_without_one_machine_mode(tmp_path):
    gcs, client, agent = free_ports(3)
    with open(tmp_path / "head.log", "w") as out:
        head = subprocess.Popen(HEAD.format(gcs=gcs, client=client, agent=agent).split(), cwd=REPO_ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env=child_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"),
                                start_new_session=True)
    try:
        # The driver waits for the head itself (trainer.ray_connect_timeout_s=60 covers its start).
        done = subprocess.run([sys.executable, "-c", ATTACH], cwd=REPO_ROOT, capture_output=True, text=True,
                              env=_driver_env(RAY_ADDRESS=f"127.0.0.1:{gcs}"), timeout=240)
    finally:
        head.terminate()  # `ray start --block` ends exactly its own cluster's processes
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        leftovers = kill_leftovers(head.pid, gcs)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"attached 127.0.0.1:{gcs} 3.0" in done.stdout, done.stdout + done.stderr[-3000:]
    assert leftovers == [], leftovers
