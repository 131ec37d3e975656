"""Security defaults: a local Ray cluster listens on loopback only, nothing is unpickled from disk without
`weights_only=True`, and user reward code comes only from the path the config names."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.processes import REPO_ROOT, child_env
from trainer.rewards import RuleRewardManager, load_reward_function

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
PRODUCTION_PACKAGES = ("single_controller", "protocol", "trainer", "workers", "recipes", "examples", "benchmarks")

LIST_LISTENERS = """
import json, psutil
from trainer.config_loader import load_config
from trainer.main import init_ray
init_ray(load_config(["trainer.n_gpus_per_node=1"]))
import ray
ray.get(ray.remote(lambda: 1).remote())  # a worker process is up too
found = []
for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
    try:
        found += [[process.name(), c.laddr.ip, c.laddr.port] for c in process.net_connections("inet")
                  if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        pass
print("LISTENERS=" + json.dumps(found))
"""


@pytest.mark.slow
def test_local_ray_cluster_listens_on_loopback_only(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", LIST_LISTENERS], cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=180
    )
    line = next((l for l in done.stdout.splitlines() if l.startswith("LISTENERS=")), None)
    assert line, done.stdout[-3000:] + done.stderr[-3000:]
    listeners = json.loads(line.removeprefix("LISTENERS="))
    names = {name for name, _, _ in listeners}
    assert "gcs_server" in names and "raylet" in names, listeners
    exposed = [entry for entry in listeners if entry[1] not in LOOPBACK]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def _torch_load_calls(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load":
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("torch", "pickle", "dill", "cloudpickle"):
                yield owner.id, node


def test_no_unsafe_unpickling_in_the_code():
    unsafe = []
    for package in PRODUCTION_PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            for owner, call in _torch_load_calls(path):
                safe = owner == "torch" and any(
                    k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in call.keywords
                )
                if not safe:
                    unsafe.append(f"{path.relative_to(REPO_ROOT)}:{call.lineno} {owner}.load")
    assert unsafe == [], f"loads that can run code from a file: {unsafe}"


def test_reward_code_is_loaded_only_from_the_configured_path(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    for name in ("chosen", "other"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "my_reward.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n"
            f"def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return {name!r}\n"
        )
    # Decoys where a search might look: the working directory and sys.path.
    monkeypatch.chdir(tmp_path / "other")
    monkeypatch.syspath_prepend(str(tmp_path / "other"))
    modules_before, path_before = set(sys.modules), list(sys.path)
    function = load_reward_function(str(tmp_path / "chosen" / "my_reward.py"))
    assert function("s", "x", "y") == "chosen" and marker.read_text() == "chosen\n"
    assert set(sys.modules) == modules_before and sys.path == path_before  # nothing registered or added
    # With no path configured, only the built-in scorers are used: nothing from the working directory runs.
    marker.unlink()
    (tmp_path / "other" / "compute_score.py").write_text(f"open({str(marker)!r}, 'a').write('decoy')\n")
    from trainer.rewards import compute_score

    assert load_reward_function(None) is compute_score
    RuleRewardManager(tokenizer=None)
    assert not marker.exists()
    with pytest.raises(FileNotFoundError, match="reward function file 'missing.py' does not exist"):
        load_reward_function("missing.py")
