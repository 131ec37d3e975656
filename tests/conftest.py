"""One local Ray cluster per test process (pytest-xdist runs two, pyproject.toml), bound to 127.0.0.1, shared by
every test of that process that needs Ray."""

import os
from collections import Counter
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Ray's log monitor lists its log folder for new files at every pass (10 a second) while it tracks fewer than this
# many; at 0 it lists every 0.5 s (LOG_NAME_UPDATE_INTERVAL_S). Measured on this 2-core machine, 160 actors started
# and stopped: the monitor's CPU halved (6.1 -> 3.0 s in 115 s); over a session's ~400 worker log files it took ~3%
# of a core per cluster.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
# 8 logical CPUs on a 2-core machine: tests create several small groups side by side.
TEST_CLUSTER_CPUS = 8


def _start_ray() -> None:
    import ray

    from single_controller.ray.local_cluster import init_local_ray

    if ray.is_initialized():
        return
    init_local_ray(  # always a fresh cluster of our own (never one left running), on loopback only
        num_cpus=TEST_CLUSTER_CPUS,
        object_store_memory=2 << 30,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "disabled"}},
        log_to_driver=True,
    )


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    _start_ray()
    yield ray
    ray.shutdown()


@pytest.fixture
def no_ray(monkeypatch):
    """Fails the test if the run gets as far as starting Ray (the input should have failed before). A check
    of `ray.is_initialized()` would not do: the session cluster may already be up in this process."""

    def must_not_start(cfg):
        raise AssertionError("Ray was started for an input that should have failed before it")

    monkeypatch.setattr("trainer.run_setup.init_ray", must_not_start)


# The assets every trainer test reads, and the runs that files of several folders read, are defined here once: a
# fixture imported into two conftest files is two fixtures, each built once per test process.
@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """The embedded tiny model and the learnable synthetic task, built once per session."""
    from trainer.datasets.synthetic import write_synthetic_dataset
    from trainer.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("assets")
    model = build_tiny_model(root / "model", seed=0)
    train, val = write_synthetic_dataset(root / "data", train_size=512, val_size=32, seed=0)
    return {"model": str(model), "train": str(train), "val": str(val)}


@pytest.fixture(scope="session")
def learning_assets(tiny_assets, tmp_path_factory):
    """The tiny model with the default job's data (1024 prompts): the learning tests reach their reward in fewer
    steps on it than on `tiny_assets`' 512 (measured in each test's comment)."""
    from trainer.datasets.synthetic import write_synthetic_dataset

    train, val = write_synthetic_dataset(tmp_path_factory.mktemp("learning_data"))
    return {**tiny_assets, "train": str(train), "val": str(val)}


@pytest.fixture(scope="session")
def raft_run(ray_cluster, tiny_assets, tmp_path_factory):
    """(history, config, output folder) of six `recipes.raft` steps on the FSDP actor (two ranks, a constant learning
    rate): tests/recipes/test_raft.py checks that it learns, tests/megatron/test_megatron_sft.py compares its first
    step with the Megatron actor's."""
    from recipes import raft
    from tests.e2e.conftest import run_overrides
    from trainer.recipe_runner import load_recipe_config

    out = tmp_path_factory.mktemp("raft")
    cfg = load_recipe_config(raft, run_overrides(
        tiny_assets, out, "trainer.total_training_steps=6", "trainer.test_freq=-1", "trainer.val_before_train=false",
    ))
    return raft.run(cfg), cfg, out


# Session fixtures that cost a cluster start or a training run: the files using one run in the same test process,
# so that it is built once (pytest-xdist's `loadgroup`, pyproject.toml).
SHARED_EXPENSIVE_FIXTURES = ("multinode_cluster", "lora_hybrid_run", "megatron_probes", "raft_run")


def process_groups(items: list[pytest.Item]) -> dict[Path, str]:
    """File -> the unit the test processes take one at a time: the file itself, or the expensive session fixture
    that a test of the file uses (a file is never split: its module fixtures are built once)."""
    groups: dict[Path, str] = {}
    for item in items:
        groups.setdefault(item.path, item.nodeid.partition("::")[0])
        shared = [name for name in SHARED_EXPENSIVE_FIXTURES if name in item.fixturenames]
        if shared:
            groups[item.path] = shared[0]
    return groups


def pytest_configure(config: pytest.Config) -> None:
    from tests import process_timeline

    process_timeline.register(config)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test goes to its file's process group (`process_groups`); groups with the most `slow` tests first, the
    rest in their order: the test processes take a group at a time, so the long ones start early and the short
    ones fill the end (no process left alone with a long group while the others have nothing to do). pytest-xdist
    keeps this order only with `--no-loadscope-reorder` (pyproject.toml); its default sorts the groups by their
    number of tests, which puts the long one-test files last."""
    groups = process_groups(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.path]))
    slow_per_group = Counter(groups[item.path] for item in items if item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow_per_group[groups[item.path]])  # stable: a group's tests keep their order
