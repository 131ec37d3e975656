"""Fixtures shared with the worker tests (same definitions, imported so they are reused)."""

from tests.workers.conftest import pool_2, tiny_model_dir  # noqa: F401
