"""Run `benchmarks.peers.verl_gpu` detached from the device call that starts it, and collect it from later calls.

    python -m benchmarks.peers.background start --dir /tmp/peers_7b -- --preset 7b-2gpu [verl_gpu arguments]
    python -m benchmarks.peers.background wait --dir /tmp/peers_7b --for 560 [--out $OUT]

A device call lasts 10 minutes at most and kills what it leaves running, except a process in a session of its
own; the machine stays warm 30 s after a call. `start` copies the project's code to `<dir>/repo` (each call copies
the working tree onto the machine again, and a side started while that happens could import half a tree) and
launches verl_gpu from there in a new session (its output folder is `<dir>/out`, its log `<dir>/driver_log.txt`),
and returns at once; `wait` waits until it ends or `--for` seconds
pass, prints where it is (sides done, the running side's last log line) and packs `<dir>/out` into
`<out>/peers.tar.gz` (logs cut to their last 4 MiB), with runs.json, peers_gpu.json and the driver log's tail
beside it. Exit code: 0 when verl_gpu ended with 0, 1 when it failed, 3 while it still runs (call `wait` again,
at once: the machine goes back 30 s after a call, and the run with it).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_TAIL_BYTES = 4 << 20
STILL_RUNNING = 3
PROGRESS_EVERY_S = 60.0
CODE = ("protocol", "single_controller", "workers", "trainer", "recipes", "benchmarks", "pyproject.toml")


def snapshot(folder: Path) -> Path:
    """The project's code copied to <dir>/repo (what the detached run imports, its workers included)."""
    target = folder / "repo"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in CODE:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, target / name)
    return target


def detached_env(code: Path) -> dict[str, str]:
    """This environment with the project's root on PYTHONPATH replaced by the snapshot."""
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    replaced = [str(code) if Path(p).resolve() == REPO_ROOT else p for p in entries]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(replaced))


def start(folder: Path, verl_gpu_args: list[str]) -> int:
    """Launch the detached runner; refuses when one is running in `folder` already."""
    if running(folder):
        pid = (folder / "pid").read_text().strip()
        print(f"error: a run is going on in {folder} (pid {pid}); `wait` for it", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exit_code").unlink(missing_ok=True)
    code = snapshot(folder)
    command = [sys.executable, "-m", "benchmarks.peers.background", "run", "--dir", str(folder.resolve()), "--",
               *verl_gpu_args]
    with open(folder / "driver_log.txt", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=code, env=detached_env(code),
                                   start_new_session=True)
    (folder / "pid").write_text(str(process.pid))
    (folder / "command.json").write_text(json.dumps({"command": command, "cwd": str(code)}))
    print(f"started pid {process.pid}: verl_gpu {' '.join(verl_gpu_args)} (log {folder / 'driver_log.txt'})",
          flush=True)
    return 0


def run(folder: Path, verl_gpu_args: list[str]) -> int:
    """The detached process: verl_gpu with `<dir>/out` as its output folder, then its exit code to a file."""
    command = [sys.executable, "-m", "benchmarks.peers.verl_gpu", *verl_gpu_args, "--out-dir", str(folder / "out")]
    code = subprocess.run(command, cwd=REPO_ROOT).returncode
    (folder / "exit_code").write_text(str(code))
    return code


def running(folder: Path) -> bool:
    pid_file = folder / "pid"
    if not pid_file.exists() or (folder / "exit_code").exists():
        return False
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (ProcessLookupError, ValueError):
        return False
    return True


def progress(folder: Path) -> str:
    """Which sides have ended (runs.json) and the last line the driver printed."""
    runs_file = folder / "out" / "runs.json"
    done = json.loads(runs_file.read_text()) if runs_file.exists() else {}
    ended = ", ".join(f"{side} exit {record.get('exit')}" for side, record in done.items()) or "no side ended yet"
    log = folder / "driver_log.txt"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return f"{ended}; driver: {lines[-1][:200] if lines else '(no output yet)'}"


def pack(folder: Path, out: Path) -> Path:
    """<out>/peers.tar.gz of <dir>/out (logs cut to their tails) and the small files beside it."""
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "peers.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted((folder / "out").glob("*")) + [folder / "driver_log.txt"]:
            if not path.is_file():
                continue
            data = path.read_bytes()
            if path.name.endswith("_log.txt") and len(data) > LOG_TAIL_BYTES:
                data = data[-LOG_TAIL_BYTES:]
            info = tarfile.TarInfo(path.name)
            info.size, info.mtime = len(data), int(path.stat().st_mtime)
            tar.addfile(info, io.BytesIO(data))
    for name in ("runs.json", "peers_gpu.json", "setup.json"):
        if (folder / "out" / name).exists():
            (out / name).write_bytes((folder / "out" / name).read_bytes())
    log = folder / "driver_log.txt"
    if log.exists():
        (out / "driver_log_tail.txt").write_text("\n".join(log.read_text(errors="replace").splitlines()[-200:]))
    return archive


def wait(folder: Path, seconds: float, out: Path | None) -> int:
    if not (folder / "pid").exists():
        print(f"error: no run was started in {folder}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + seconds
    next_report = time.monotonic()
    while running(folder) and time.monotonic() < deadline:
        if time.monotonic() >= next_report:
            print(f"[{time.strftime('%H:%M:%S')}] {progress(folder)}", flush=True)
            next_report += PROGRESS_EVERY_S
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    if out is not None:
        print(f"packed {pack(folder, out)}")
    if running(folder):
        print(f"still running: {progress(folder)}; call `wait` again at once")
        return STILL_RUNNING
    code = int((folder / "exit_code").read_text()) if (folder / "exit_code").exists() else 1
    print(f"ended with exit {code}: {progress(folder)}")
    return 0 if code == 0 else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        rest = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("start", "wait", "run"))
    parser.add_argument("--dir", type=Path, required=True, help="the run's folder (outputs under <dir>/out)")
    parser.add_argument("--for", dest="seconds", type=float, default=560.0, help="wait: seconds at most")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                        help="wait: where to pack the outputs (default $OUT)")
    args = parser.parse_args(argv)
    if "--out-dir" in rest:
        parser.error("the output folder is <dir>/out: leave --out-dir out of verl_gpu's arguments")
    if args.action == "start":
        return start(args.dir, rest)
    if args.action == "run":
        return run(args.dir, rest)
    return wait(args.dir, args.seconds, args.out)


if __name__ == "__main__":
    sys.exit(main())
