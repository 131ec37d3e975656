"""`ray start --head` → `ray job submit --working-dir . -- python -m trainer.main ...` → `ray stop`, all on
127.0.0.1: the job's log shows finished steps and the job SUCCEEDED.

`ray stop` ends every Ray process it can see, so it runs inside a private PID namespace
(`unshare --pid --mount-proc`) where it sees only this test's cluster, never the test session's own
cluster or anything else on the machine. Where namespaces are not allowed, the test skips `ray stop` and
ends exactly the processes of its cluster (matched by its unique GCS port) by pid.
"""

import os
import re
import shutil
import socket
import subprocess

import psutil
import pytest

from tests.reliability.conftest import short_run
from tests.reliability.processes import REPO_ROOT, child_env

pytestmark = pytest.mark.slow

SCRIPT = r"""
set -u
ray start --head --node-ip-address 127.0.0.1 --port {gcs} --dashboard-host 127.0.0.1 --dashboard-port {dashboard} \
    --ray-client-server-port {client} --dashboard-agent-listen-port {agent} --num-cpus 4 --disable-usage-stats \
    > {out}/start.log 2>&1 || exit 3
for attempt in $(seq 40); do  # the job agent comes up a few seconds after `ray start` returns
    ray job submit --address http://127.0.0.1:{dashboard} --working-dir . -- python -m trainer.main {overrides} \
        > {out}/submit.log 2>&1
    rc=$?
    grep -q "No available agent" {out}/submit.log || break
    sleep 1
done
ray job list --address http://127.0.0.1:{dashboard} > {out}/status.log 2>&1
{stop}
exit $rc
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def namespace_prefix() -> list[str] | None:
    """An `unshare` command line giving a private PID namespace and /proc, or None where not allowed."""
    if shutil.which("unshare") is None:
        return None
    for extra in ([], ["--user", "--map-root-user"]):
        command = ["unshare", *extra, "--pid", "--fork", "--mount-proc"]
        if subprocess.run([*command, "true"], capture_output=True).returncode == 0:
            return command
    return None


def cluster_processes(session_id: int, gcs_port: int) -> list[psutil.Process]:
    """The processes of this test's cluster: those in the script's session (`ray start` keeps its daemons
    there) or naming the cluster's GCS port, which is this test's alone."""
    needle = f"127.0.0.1:{gcs_port}"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            in_session = session_id > 1 and os.getsid(process.pid) == session_id
        except OSError:
            continue
        if in_session or any(needle in part or part == f"--gcs_server_port={gcs_port}" for part in process.info["cmdline"] or []):
            found.append(process)
    return found


def test_ray_start_job_submit_ray_stop(small_assets, tmp_path):
    gcs, dashboard, client, agent = free_ports(4)
    prefix = namespace_prefix()
    overrides = short_run(small_assets, tmp_path / "run", "trainer.logger=[console]", "trainer.n_gpus_per_node=2")
    script = SCRIPT.format(
        gcs=gcs, dashboard=dashboard, client=client, agent=agent, out=tmp_path,
        overrides=" ".join(f"'{o}'" for o in overrides), stop="ray stop --force > /dev/null 2>&1" if prefix else ":",
    )
    (tmp_path / "cluster.sh").write_text(script)
    # One machine: keep every port of the cluster on loopback (see docs/operations.md).
    env = child_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    cluster = subprocess.Popen(
        [*(prefix or []), "bash", str(tmp_path / "cluster.sh")], cwd=REPO_ROOT, env=env, start_new_session=True,
    )
    try:
        returncode = cluster.wait(timeout=240)
    finally:
        if cluster.poll() is None:
            cluster.kill()
        leftovers = [p for p in cluster_processes(cluster.pid, gcs) if p.pid != os.getpid()]
        for process in leftovers:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(leftovers, timeout=10)
    logs = {name: (tmp_path / f"{name}.log").read_text() if (tmp_path / f"{name}.log").exists() else "" for name in ("start", "submit", "status")}
    context = f"rc={returncode}\n" + "\n".join(f"--- {k}\n{v[-3000:]}" for k, v in logs.items())
    assert returncode == 0, context
    submit = logs["submit"]
    assert "step 1: reward/mean=" in submit and "step 2: reward/mean=" in submit, context  # the console logger's lines
    assert re.search(r"Job 'raysubmit_\w+' succeeded", submit), context
    job_id = re.search(r"raysubmit_\w+", submit).group(0)
    assert re.search(rf"submission_id='{job_id}'.*status=<JobStatus.SUCCEEDED", logs["status"], re.S), context
    assert (tmp_path / "run" / "global_step_2" / "MANIFEST.json").is_file()  # the job saved at the end
    if prefix:
        assert leftovers == [], f"`ray stop` left processes of the cluster: {leftovers}"
