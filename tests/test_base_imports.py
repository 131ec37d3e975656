"""The base install (`pip install -e .`) imports every module of the project: vllm, megatron-core, wandb,
mlflow and the rest of the extras are imported only inside the code a setting reaches. Checked in a fresh
interpreter with the extras' packages hidden (CI also runs tests/base_imports.py in a venv holding only
the base install)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.base_imports import optional_import_names, project_modules

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_extras_packages_are_the_ones_hidden():
    hidden = optional_import_names()
    for name in ("vllm", "megatron", "wandb", "mlflow", "pytest"):
        assert name in hidden or importlib.util.find_spec(name) is None, (name, hidden)
    for base in ("torch", "transformers", "peft", "ray"):
        assert base not in hidden


def test_every_module_imports_without_the_extras_packages():
    hidden = optional_import_names()
    command = [sys.executable, "-m", "tests.base_imports", *hidden]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip() == f"all {len(project_modules())} modules import"
