"""The project's modules import each other in one direction only: the import graph, read from source, never
goes from a lower floor to a higher one and has no cycle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("protocol", "single_controller", "workers", "trainer", "recipes")
# Lowest first; a module imports its own floor or lower ones only. A module's floor is the longest entry its
# name starts with, so workers.rl_math (the RL math the workers run) sits below the rest of workers/.
FLOORS = ("protocol", "single_controller", "workers.rl_math", "workers", "trainer", "recipes")


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str], root: Path = REPO_ROOT) -> set[str]:
    """Every project module `path` imports: top-level, in functions and under TYPE_CHECKING alike."""
    this = module_name(path, root)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in known:  # `from a.b import func` names module a.b
                name = name.rpartition(".")[0]
            # A package's __init__ re-exporting its children is not a cycle: skip child -> own parent package.
            if name and name != this and not this.startswith(name + "."):
                found.add(name)
    return found


def import_graph(packages: tuple[str, ...] = PACKAGES, root: Path = REPO_ROOT) -> dict[str, set[str]]:
    files = [f for pkg in packages for f in sorted((root / pkg).rglob("*.py"))]
    known = {module_name(f, root) for f in files}
    return {module_name(f, root): imported_modules(f, known, root) for f in files}


def floor_of(module: str, floors: tuple[str, ...] = FLOORS) -> int:
    """Index in `floors` of the longest entry that is `module` or one of its parent packages."""
    matches = [i for i, floor in enumerate(floors) if module == floor or module.startswith(floor + ".")]
    if not matches:
        raise ValueError(f"module {module!r} is on no floor of {floors}")
    return max(matches, key=lambda i: len(floors[i]))


def upward_imports(graph: dict[str, set[str]], floors: tuple[str, ...] = FLOORS) -> list[str]:
    """`importer -> imported` for every import of a module on a higher floor than the importer's."""
    return sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        for imported in imports
        if floor_of(imported, floors) > floor_of(module, floors)
    )


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_graph_reads_the_known_edges():
    graph = import_graph()
    assert "protocol.data_proto" in graph["protocol"]
    assert "single_controller.modes" in graph["single_controller.dispatch"]
    assert "trainer.run_setup" in graph["trainer.launch"]  # a function-level import counts


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_cycle_finder(graph, expected):
    assert find_cycles(graph) == expected


@pytest.mark.parametrize(
    "module, floor",
    [("protocol", 0), ("single_controller.ray.worker_group", 1), ("workers.rl_math.losses", 2), ("workers.rl_math", 2),
     ("workers.rl_mathematics", 3), ("workers", 3), ("trainer.main", 4), ("recipes.raft", 5)],
)
def test_floor_of_a_module(module, floor):
    assert floor_of(module) == floor


def test_checker_catches_planted_upward_imports():
    graph = {
        "protocol.data_proto": {"single_controller.worker"},
        "single_controller.worker": {"protocol.data_proto"},
        "workers.rl_math.losses": {"workers.rl_math.masked", "workers.fsdp.actor"},
        "workers.rl_math.masked": set(),
        "workers.fsdp.actor": {"workers.rl_math.losses", "trainer.algorithms", "protocol.data_proto"},
        "trainer.algorithms": {"workers.rl_math.losses"},
        "trainer.main": {"recipes.runner", "workers.fsdp.actor"},
        "recipes.runner": {"trainer.main"},
    }
    assert upward_imports(graph) == [
        "protocol.data_proto -> single_controller.worker",
        "trainer.main -> recipes.runner",
        "workers.fsdp.actor -> trainer.algorithms",
        "workers.rl_math.losses -> workers.fsdp.actor",
    ]


def test_checker_reads_planted_function_level_and_type_checking_imports(tmp_path):
    (tmp_path / "workers").mkdir()
    (tmp_path / "trainer").mkdir()
    (tmp_path / "workers" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "algorithms.py").write_text("LOSS = 1\n")
    (tmp_path / "trainer" / "loop.py").write_text("from workers.actor import update\n")
    (tmp_path / "workers" / "actor.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from trainer.loop import Loop\n"
        "def update():\n    from trainer.algorithms import LOSS\n    return LOSS\n"
    )
    graph = import_graph(("workers", "trainer"), root=tmp_path)
    assert upward_imports(graph) == ["workers.actor -> trainer.algorithms", "workers.actor -> trainer.loop"]
    assert find_cycles(graph) == [["trainer.loop", "workers.actor"]]


def test_no_import_from_a_lower_floor_to_a_higher_one():
    upward = upward_imports(import_graph())
    assert not upward, (
        f"imports from a lower floor to a higher one (floors, lowest first: {' < '.join(FLOORS)}); move the "
        "imported code down or the importer up:\n" + "\n".join(upward)
    )


def test_the_config_check_loads_no_torch():
    # `python -m trainer.main` checks the config before torch loads, so a bad override fails in about a second;
    # the names it checks against (workers/rl_math/names.py, workers/rollout_choices.py) and the memory plan with
    # the workers' limits it counts (workers/cached_blocks_limit.py) must stay torch-free.
    code = ("import sys, trainer.main, trainer.config_loader, trainer.memory_plan; "
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (make each one-directional):\n" + "\n".join(" <-> ".join(c) for c in cycles)
