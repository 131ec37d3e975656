"""Fixtures shared with the worker and end-to-end tests (same definitions, imported so they are reused)."""

from tests.e2e.conftest import tiny_assets  # noqa: F401
from tests.workers.conftest import pool_2, tiny_model_dir  # noqa: F401
