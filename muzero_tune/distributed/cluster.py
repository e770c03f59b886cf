"""How this process gets its Ray: join a running cluster (an address, or ``RAY_ADDRESS``) or start one.

Joining checks first that the address answers (a TCP connect with a timeout): Ray 2.60's
``ray.init(address=)`` on an address where nothing listens retries for minutes, logging, instead of
failing. An unreachable or unusable address is a :class:`ClusterError` (one line, naming the address).
This module never stops a cluster it joined; ``ray.shutdown()`` only disconnects from one. It leaves Ray's
security as the user's Ray configures it: a local cluster it starts keeps Ray's default authentication
(token auth on for local clusters since Ray 2.59), and joining a cluster that uses tokens takes the token
from where Ray looks for it (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, or Ray's default token file).
Usage statistics are off unless the environment turns them on (``RAY_USAGE_STATS_ENABLED``).
"""

from __future__ import annotations

import os
import socket

from muzero_tune.errors import UserError

DEFAULT_CONNECT_TIMEOUT_S = 10.0


class ClusterError(UserError):
    """A Ray cluster to join cannot be reached or used; the message names the address."""


def requested_address(address: str | None = None) -> str | None:
    """The cluster to join: ``address`` if given, else ``RAY_ADDRESS`` if set, else None (start locally)."""
    if address:
        return address
    return os.environ.get("RAY_ADDRESS") or None


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of ``host:port`` or ``ray://host:port``; None for ``auto`` / ``local`` (no probe)."""
    text = address.split("://", 1)[1] if "://" in address else address
    if text in ("auto", "local"):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(
            f"--address {address!r}: expected HOST:PORT (the head's GCS port, 6379 unless `ray start --head "
            f"--port` said otherwise), ray://HOST:PORT or auto"
        )
    return host, int(port)


def check_reachable(address: str, *, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`ClusterError` unless a TCP connection to ``address`` succeeds within timeout_s."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout_s):
            pass
    except OSError as e:
        raise ClusterError(
            f"cannot reach the Ray cluster at {address} within {timeout_s:g} s ({type(e).__name__}: "
            f"{e.strerror or e}); start its head with `ray start --head --port {hp[1]}` or pass the address "
            f"`ray start --head` printed (--address, or RAY_ADDRESS)"
        ) from None


def join_cluster(address: str, *, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Connect this process to the running cluster at ``address`` (no-op if Ray is already initialised)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    check_reachable(address, timeout_s=connect_timeout_s)
    try:
        ray.init(address=address, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(
            f"cannot join the Ray cluster at {address}: {' '.join(str(e).split())[:300]}"
        ) from None


def start_or_join(
    *, num_cpus: int, address: str | None = None, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
) -> None:
    """Join ``address`` (or ``RAY_ADDRESS``) when one is given, else start a local Ray with num_cpus logical
    CPUs. No-op if Ray is already initialised in this process."""
    import ray

    if ray.is_initialized():
        return
    target = requested_address(address)
    if target is not None:
        join_cluster(target, connect_timeout_s=connect_timeout_s)
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # address="local": a new local instance even when a `ray start` cluster runs on this machine (a bare
    # ray.init() would join that one and then refuse num_cpus)
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        ignore_reinit_error=True,
        log_to_driver=True,
    )


def alive_nodes() -> list[dict]:
    """The cluster's live nodes: ``[{"node_id": hex, "resources": {name: amount}}]``."""
    import ray

    return [
        {"node_id": n["NodeID"], "resources": dict(n.get("Resources", {}))}
        for n in ray.nodes()
        if n.get("Alive")
    ]
