"""benchmarks/peers/background.py: verl_gpu started detached (a process session of its own, as a device call
needs to outlive its 10 minutes) and collected into one archive by `wait`."""

from __future__ import annotations

import tarfile

from benchmarks.peers.background import main


def test_start_then_wait_packs_the_outputs(tmp_path, capsys):
    folder, out = tmp_path / "run", tmp_path / "OUT"
    assert main(["start", "--dir", str(folder), "--", "--preset", "7b-2gpu", "--dry-run"]) == 0
    assert main(["wait", "--dir", str(folder), "--for", "120", "--out", str(out)]) == 0
    assert (folder / "exit_code").read_text() == "0"
    assert (folder / "repo" / "benchmarks" / "peers" / "verl_gpu.py").is_file()  # it ran from its own copy of the code
    with tarfile.open(out / "peers.tar.gz") as tar:
        log = tar.extractfile("driver_log.txt").read().decode()
    assert "verl (limit 900 s" in log and "ours_packed" in log  # verl_gpu's dry run ran detached
    assert (out / "driver_log_tail.txt").read_text().strip()
    assert "ended with exit 0" in capsys.readouterr().out


def test_wait_without_a_run(tmp_path, capsys):
    assert main(["wait", "--dir", str(tmp_path / "none"), "--for", "1"]) == 2
    assert "no run was started" in capsys.readouterr().err
