"""Fixtures shared with the end-to-end tests (imported so the session-scoped assets are built once)."""

from tests.e2e.conftest import tiny_assets  # noqa: F401
