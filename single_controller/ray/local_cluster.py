"""Start a local Ray cluster whose every port (GCS, raylet, object manager, workers) listens on 127.0.0.1."""

from __future__ import annotations

import os
from typing import Any

# Ray's one-machine mode; the environment variable is inherited by Ray's own processes.
SINGLE_MACHINE_FLAG = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"


def prepend_pythonpath(*folders: str) -> str:
    """`folders` in front of this process's PYTHONPATH, for a runtime_env: workers keep finding whatever the
    user's PYTHONPATH names (e.g. packages installed with --target) as well as the code in `folders`."""
    return os.pathsep.join(filter(None, [*folders, os.environ.get("PYTHONPATH")]))


def keep_ray_on_loopback() -> None:
    """Ray's one-machine mode for this process (unless the flag is set otherwise): 127.0.0.1 stays 127.0.0.1.

    On Linux Ray otherwise replaces 127.0.0.1 by the machine's address and listens on every interface.
    Ray reads the flag into a module constant at import, so the constant is set here too (a private Ray
    attribute: tests/reliability/test_security.py checks every listening socket, so a Ray change shows).
    """
    from ray._private import ray_constants

    os.environ.setdefault(SINGLE_MACHINE_FLAG, "0")
    ray_constants.ENABLE_RAY_CLUSTER = os.environ[SINGLE_MACHINE_FLAG] not in ("0", "false", "False")


def init_local_ray(**kwargs: Any) -> None:
    """`ray.init(address="local", ...)` bound to loopback, without the dashboard unless asked for."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    keep_ray_on_loopback()
    kwargs.setdefault("include_dashboard", False)
    ray.init(address="local", _node_ip_address=LOOPBACK, **kwargs)
