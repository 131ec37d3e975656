"""Running `python -m trainer.main` with two pool nodes on the multi-node cluster, and reading where its
ranks went from the placement line it prints."""

from __future__ import annotations

import re
from pathlib import Path

from tests.reliability.conftest import short_run

PLACEMENT = re.compile(r"worker group 'roles': rank 0 on node (\w+) \(([\d.]+)\), rank 1 on node (\w+) \(([\d.]+)\)")


def multinode_run(assets: dict[str, str], out_dir: Path, *extra: str) -> list[str]:
    """The arguments of a short run over two nodes of one worker process each."""
    return ["-m", "trainer.main", *short_run(assets, out_dir, "trainer.nnodes=2", "trainer.n_gpus_per_node=1", *extra)]


def placed_nodes(output: str, worker_nodes: list[str]) -> list[str]:
    """The full ids of the nodes holding ranks 0 and 1, read from the trainer's placement line."""
    found = PLACEMENT.search(output)
    assert found, output[-4000:]
    return [next(node for node in worker_nodes if node.startswith(found.group(i))) for i in (1, 3)]
