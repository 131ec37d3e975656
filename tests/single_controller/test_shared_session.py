"""A `ray job submit --working-dir` driver on a cluster with several Ray nodes on one machine is refused with the
reason and the way out (single_controller/ray/shared_session.py); anything else passes."""

from pathlib import Path

from single_controller.ray.resource_pool import alive_nodes
from single_controller.ray.shared_session import check_working_dir, hosts_with_several_nodes, working_dir_problem


def node(address: str) -> dict:
    return {"NodeManagerAddress": address, "Alive": True}


def test_two_nodes_of_one_machine_with_the_code_in_the_working_dir_are_refused(tmp_path: Path):
    code = tmp_path / "trainer" / "main.py"
    problem = working_dir_problem(tmp_path, code, [node("10.0.0.1"), node("10.0.0.1"), node("10.0.0.2")])
    assert problem is not None
    assert "2 on 10.0.0.1" in problem and "10.0.0.2" not in problem
    assert "without --working-dir" in problem and "PYTHONPATH" in problem and "docs/multi_node.md" in problem


def test_nodes_on_separate_machines_pass(tmp_path: Path):
    nodes = [node("10.0.0.1"), node("10.0.0.2")]
    assert working_dir_problem(tmp_path, tmp_path / "trainer" / "main.py", nodes) is None


def test_code_installed_elsewhere_passes(tmp_path: Path):
    nodes = [node("10.0.0.1"), node("10.0.0.1")]
    installed = tmp_path / "site-packages" / "trainer" / "main.py"
    assert working_dir_problem(tmp_path / "job", installed, nodes) is None


def test_hosts_with_several_nodes_counts_per_address():
    assert hosts_with_several_nodes([node("10.0.0.1"), node("10.0.0.2")]) == {}
    assert hosts_with_several_nodes([node("10.0.0.1")] * 3 + [node("10.0.0.2")]) == {"10.0.0.1": 3}


def test_a_driver_without_a_working_dir_passes_and_only_alive_nodes_are_listed(ray_cluster):
    assert check_working_dir() is None
    alive = alive_nodes()
    assert len(alive) == 1 and alive[0]["Alive"]
