"""The Megatron probe groups that the layout tests share."""

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from tests.megatron.workers import MegatronProbe

PROBES_FIXTURE = "megatron_probes"


class ProbeGroups:
    """One detached group of `MegatronProbe`s per world size, started on first use: every layout of that size runs
    on it (each probe process imports megatron-core once, ~7 CPU-s, instead of once per layout). A test gets a fresh
    driver-side view of it (`RayWorkerGroup.from_detached`), so mesh placements are queried for its own layout."""

    def __init__(self) -> None:
        self._started: dict[int, tuple[RayResourcePool, RayWorkerGroup]] = {}

    @contextmanager
    def __call__(self, world_size: int) -> Iterator[RayWorkerGroup]:
        name = f"megatron_probe_{world_size}"
        if world_size not in self._started:
            pool = RayResourcePool([world_size], use_gpu=False, detached=True, name_prefix=name + "_")
            group = RayWorkerGroup(pool, RayClassWithInitArgs(MegatronProbe), name_prefix=name, detached=True)
            self._started[world_size] = (pool, group)
        try:
            yield RayWorkerGroup.from_detached(name, MegatronProbe)
        except BaseException:
            self._stop(world_size)  # a rank may still wait in a collective: the next test starts a fresh group
            raise

    def _stop(self, world_size: int) -> None:
        pool, group = self._started.pop(world_size)
        group.kill()
        pool.release()

    def close(self) -> None:
        for world_size in list(self._started):
            self._stop(world_size)


_PROBES = ProbeGroups()


@pytest.fixture(scope="session")
def megatron_probes(ray_cluster) -> ProbeGroups:
    """`with megatron_probes(world_size) as group:` a worker group of that size for one layout. The files using it
    run one after another in one test process (tests/conftest.py, SHARED_EXPENSIVE_FIXTURES)."""
    return _PROBES


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # The one place the groups stop (nextitem is None after the session's last test). They hold up to 7 of the test
    # cluster's 8 CPUs: given back as soon as the tests using them are done, not at the end of the session (a later
    # user starts them again).
    if PROBES_FIXTURE in item.fixturenames and (nextitem is None or PROBES_FIXTURE not in nextitem.fixturenames):
        _PROBES.close()
