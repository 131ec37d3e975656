"""A job's working directory on a cluster whose Ray nodes share one machine.

The Ray nodes of one machine share its session folder (`/tmp/ray/session_*`). `ray job submit --working-dir`
unpacks the project there for the driver; when the first worker with the job's runtime env starts on another node
of that machine, that node's runtime-env agent (whose own cache does not list the package) removes the folder and
unpacks it again (Ray 2.60, `ray/_private/runtime_env/packaging.py`). A driver running from it loses its modules
for that moment and dies on a `ModuleNotFoundError` that names none of this. Separate machines each have their
own folder.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import ray

from single_controller.ray.resource_pool import alive_nodes

DOCS = "docs/multi_node.md, 'Several Ray nodes on one machine'"


def hosts_with_several_nodes(nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Address -> number of Ray nodes there, for the addresses holding more than one (`ray.nodes()` rows)."""
    counts = Counter(node["NodeManagerAddress"] for node in nodes)
    return {address: count for address, count in counts.items() if count > 1}


def working_dir_problem(working_dir: Path, code_file: Path, alive: list[dict[str, Any]]) -> str | None:
    """Why the job's working directory will vanish under this driver, or None.

    `working_dir`: where Ray unpacked the job's working directory (the driver's current directory); `code_file`: a
    file of this toolkit as imported here; `alive`: the alive nodes' `ray.nodes()` rows."""
    shared = hosts_with_several_nodes(alive)
    if not shared or not code_file.resolve().is_relative_to(working_dir.resolve()):
        return None
    where = ", ".join(f"{count} on {address}" for address, count in sorted(shared.items()))
    return (
        f"this run's code comes from the job's working directory (`ray job submit --working-dir`), and the cluster "
        f"has several Ray nodes on one machine ({where}): they share its session folder, and another node's Ray "
        f"agent unpacks the directory again while the driver runs from it, which then fails on a missing module. "
        f"Submit without --working-dir, with the project on PYTHONPATH (exported before each `ray start`) or "
        f"installed ({DOCS})"
    )


def check_working_dir() -> str | None:
    """`working_dir_problem` for this driver, attached to its cluster (None when the job has no working directory)."""
    if not ray.get_runtime_context().runtime_env.get("working_dir"):
        return None
    return working_dir_problem(Path(os.getcwd()), Path(__file__), alive_nodes())
