import pytest

from single_controller.ray import RayResourcePool


@pytest.fixture(scope="module")
def cpu_pool_2(ray_cluster):
    """Two CPU process slots shared by the groups of one test module."""
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)
    yield pool
    pool.release()
