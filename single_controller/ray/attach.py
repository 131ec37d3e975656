"""Attach the driver to a running Ray cluster (`RAY_ADDRESS`) within a bounded time, or say why not.

Left to itself, `ray.init(address=...)` retries an address where nothing answers for about 14 minutes (20
tries of about 40 s), and on Linux it dials the machine's address instead of a loopback one (`127.0.0.1:6379`
becomes `10.0.0.5:6379`), where a cluster started on loopback (`ray start --node-ip-address 127.0.0.1` in
Ray's one-machine mode, docs/operations.md) does not listen. So the GCS port is first probed over TCP, as
Ray would dial it and as it was typed, until `timeout_s`; a loopback address that answers only as typed
switches this driver to Ray's one-machine mode. Once the port answers, Ray gets one connection attempt
(about 40 s at most when what answers is not a Ray GCS).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from single_controller.ray.local_cluster import LOOPBACK, keep_ray_on_loopback

# Ray's own count of GCS connection attempts in ray.init (one a second, each up to ~40 s when nothing answers).
RAY_GCS_ATTEMPTS = "RAY_gcs_server_port_wait_time_s"
PROBE_INTERVAL_S = 0.5
LOOPBACK_NAMES = ("localhost", "::1")


class ClusterUnreachable(ConnectionError):
    """The cluster at RAY_ADDRESS did not answer in time; the message names the address and what to check."""


def is_loopback(host: str) -> bool:
    return host.startswith("127.") or host in LOOPBACK_NAMES


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port` GCS address; None for Ray's other forms (`auto`, `ray://...`)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return None
    return host.strip("[]"), int(port)


def refusal(host: str, port: int, timeout_s: float) -> str | None:
    """Why a TCP connection to host:port fails (None: something listens there)."""
    try:
        with socket.create_connection((host, port), timeout=max(timeout_s, 0.05)):
            return None
    except OSError as error:
        return error.strerror or type(error).__name__


def _what_to_check(address: str, port: int, timeout_s: float) -> str:
    return (
        f"is `ray start --head --port {port}` running and reachable at {address}? Check the port (the GCS port, "
        "6379 by default; http://...:8265 is the dashboard, for `ray job submit`), that RAY_ADDRESS is not set by "
        "mistake (unset it to run on a private local cluster: env -u RAY_ADDRESS), and any firewall between this "
        f"machine and the head; trainer.ray_connect_timeout_s={timeout_s:g} sets how long to wait"
    )


def wait_for_gcs(address: str, timeout_s: float) -> bool:
    """Probe `address` until something listens there, as Ray would dial it or as typed; True when only the
    typed loopback address answers (this driver must then keep Ray on loopback). ClusterUnreachable after
    `timeout_s`."""
    from ray._private.services import resolve_ip_for_localhost

    host, port = split_address(address)
    dialled = resolve_ip_for_localhost(host) if is_loopback(host) else host
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        reason = refusal(dialled, port, min(left, 2.0))
        if reason is None:
            return False
        if dialled != host and refusal(host, port, min(left, 2.0)) is None:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(PROBE_INTERVAL_S, left))
    tried = address if dialled == host else f"{address} (and {dialled}:{port}, the address Ray dials for it)"
    raise ClusterUnreachable(
        f"no Ray cluster answered at RAY_ADDRESS={tried} within {timeout_s:g} s ({reason}); "
        + _what_to_check(address, port, timeout_s)
    )


def attach(address: str, timeout_s: float, **init_kwargs: Any) -> None:
    """`ray.init(address=address, **init_kwargs)` that gives up after about `timeout_s` when nothing answers."""
    import ray

    if split_address(address) is None:
        if address.startswith(("http://", "https://")):
            raise ClusterUnreachable(
                f"RAY_ADDRESS={address} is a dashboard address (what `ray job submit --address` takes); the driver "
                "attaches to the GCS address, host:6379 by default (Ray sets it for a submitted job)"
            )
        ray.init(address=address, **init_kwargs)  # `auto`, `ray://...`: Ray's own lookup
        return
    if wait_for_gcs(address, timeout_s):
        keep_ray_on_loopback()
        init_kwargs.setdefault("_node_ip_address", LOOPBACK)
    saved = os.environ.get(RAY_GCS_ATTEMPTS)
    os.environ.setdefault(RAY_GCS_ATTEMPTS, "1")  # the port answers: one attempt tells a GCS from anything else
    try:
        ray.init(address=address, **init_kwargs)
    except (ConnectionError, RuntimeError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        _, port = split_address(address)
        raise ClusterUnreachable(
            f"something answers at RAY_ADDRESS={address}, but Ray could not attach to it ({first_line}); "
            + _what_to_check(address, port, timeout_s)
        ) from None
    finally:
        if saved is None:
            os.environ.pop(RAY_GCS_ATTEMPTS, None)
