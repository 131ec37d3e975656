"""docs/migrating_from_verl.md: every supported name exists where the page says and is exercised by a test."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "migrating_from_verl.md"
PARITY_TESTS = [
    REPO_ROOT / "tests" / "protocol" / "test_verl_parity.py",
    REPO_ROOT / "tests" / "protocol" / "test_verl_conversions.py",
    REPO_ROOT / "tests" / "single_controller" / "test_verl_parity.py",
    REPO_ROOT / "tests" / "single_controller" / "test_verl_ported_worker.py",
    REPO_ROOT / "tests" / "single_controller" / "test_tutorial_dispatch.py",
    REPO_ROOT / "tests" / "single_controller" / "verl_style_workers.py",
]
# | `name` | `module` | behaviour |
ROW = re.compile(r"^\| `([\w.]+)` \| `([\w.]+)` \|")


def supported_names() -> list[tuple[str, str]]:
    rows = []
    in_supported = False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            in_supported = line.startswith("## Supported names")
        elif in_supported and (match := ROW.match(line)):
            rows.append((match.group(1), match.group(2)))
    return rows


def test_the_page_lists_both_packages():
    modules = {module.split(".")[0] for _, module in supported_names()}
    assert modules == {"protocol", "single_controller"} and len(supported_names()) >= 40


@pytest.mark.parametrize("name,module", supported_names(), ids=lambda v: v)
def test_supported_name_exists_and_is_exercised(name, module):
    target = importlib.import_module(module)
    for part in name.split("."):
        assert hasattr(target, part), f"{module}.{name}: {part!r} missing"
        target = getattr(target, part)
    sources = "\n".join(path.read_text() for path in PARITY_TESTS)
    leaf = name.rpartition(".")[2]
    assert re.search(rf"\b{re.escape(leaf)}\b", sources), f"{name} is not exercised by the parity tests"
