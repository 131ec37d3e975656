"""A `ray job submit --working-dir` driver on a cluster with several Ray nodes on one machine is refused with the
reason and the way out (single_controller/ray/shared_session.py); anything else passes."""

from pathlib import Path

from single_controller.ray.shared_session import check_working_dir, hosts_with_several_nodes, working_dir_problem

URI = "gcs://_ray_pkg_0123456789abcdef.zip"


def node(address: str, alive: bool = True) -> dict:
    return {"NodeManagerAddress": address, "Alive": alive}


def test_two_nodes_of_one_machine_with_the_code_in_the_working_dir_are_refused(tmp_path: Path):
    code = tmp_path / "trainer" / "main.py"
    problem = working_dir_problem(URI, tmp_path, code, [node("10.0.0.1"), node("10.0.0.1"), node("10.0.0.2")])
    assert problem is not None
    assert "2 on 10.0.0.1" in problem and "10.0.0.2" not in problem
    assert "without --working-dir" in problem and "PYTHONPATH" in problem and "docs/multi_node.md" in problem


def test_nodes_on_separate_machines_pass(tmp_path: Path):
    nodes = [node("10.0.0.1"), node("10.0.0.2")]
    assert working_dir_problem(URI, tmp_path, tmp_path / "trainer" / "main.py", nodes) is None


def test_no_working_dir_or_code_installed_elsewhere_passes(tmp_path: Path):
    nodes = [node("10.0.0.1"), node("10.0.0.1")]
    assert working_dir_problem(None, tmp_path, tmp_path / "trainer" / "main.py", nodes) is None
    installed = tmp_path / "site-packages" / "trainer" / "main.py"
    assert working_dir_problem(URI, tmp_path / "job", installed, nodes) is None


def test_only_alive_nodes_count():
    assert hosts_with_several_nodes([node("10.0.0.1"), node("10.0.0.1", alive=False)]) == {}
    assert hosts_with_several_nodes([node("10.0.0.1")] * 3) == {"10.0.0.1": 3}


def test_a_driver_without_a_working_dir_passes(ray_cluster):
    assert check_working_dir() is None
