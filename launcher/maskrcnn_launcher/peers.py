"""Waiting for the master: first its DNS name, then its TCP port, each try bounded by one deadline.

An unresolvable master is the most reported failure of multi-node PyTorch on Kubernetes: a
StatefulSet pod's DNS record appears only once the pod exists (and, unless the headless Service
publishes not-ready addresses, once it is ready), so workers that start first must wait instead
of crashing into torch's rendezvous with a bare `gaierror`.

Who waits: workers. The master (rank 0) hosts the TCPStore on MASTER_PORT (torch RPC's env://
rendezvous, torchrun's static rendezvous), so it must not wait for its own port: it opens it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from maskrcnn_launcher.errors import PeerTimeout

T = TypeVar("T")


@dataclass(frozen=True)
class WaitPolicy:
    timeout_s: float = 300.0
    interval_s: float = 1.0  # between tries; doubled up to `max_interval_s`
    max_interval_s: float = 5.0
    connect_timeout_s: float = 2.0


LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on `host` right now: the kernel's pick for a bind to port 0.

    The socket is closed before the port is returned, so another process may take it before the
    caller binds it (a small race; the kernel hands out ephemeral ports round-robin, so a port just
    picked is rarely picked again at once). Good enough for `local` and tests on one machine; a
    collision shows as the master failing to bind, never as two jobs silently sharing a port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_master(host: str, port: int, policy: WaitPolicy, log: Callable[[str], None] = print) -> None:
    """Resolve `host`, then connect to `host:port`, within `policy.timeout_s` in all."""
    deadline = time.monotonic() + policy.timeout_s
    addresses = wait_for_name(host, deadline, policy, log)
    log(f"maskrcnn-launch: master {host} resolves to {', '.join(addresses)}")
    wait_for_port(host, port, deadline, policy, log)
    log(f"maskrcnn-launch: master {host}:{port} accepts connections")


def wait_until_master_reachable(host: str, port: int, policy: WaitPolicy, log: Callable[[str], None] = print) -> None:
    """`wait_for_master`, with its timeout as one line that names the host and the port whatever gave
    out (the name or the port): what `maskrcnn-launch wait-master` (the chart's `helm test`) reports."""
    try:
        wait_for_master(host, port, policy, log)
    except PeerTimeout as exc:
        raise PeerTimeout(f"master not reachable at {host}:{port}: {exc}") from exc


def wait_for_name(host: str, deadline: float, policy: WaitPolicy, log: Callable[[str], None] = print) -> list[str]:
    return _retry(
        lambda remaining: _resolve(host, remaining),
        deadline,
        policy,
        waiting=lambda error: log(f"maskrcnn-launch: waiting for master {host} to resolve ({error})"),
        gave_up=lambda tries, error: (
            f"master {host!r} did not resolve within {policy.timeout_s:g} s ({tries} tries; last error: "
            f"{error}). Check the master's pod is running, the headless Service publishes not-ready "
            "addresses, and --master-addr / MASTER_ADDR"
        ),
    )


def wait_for_port(
    host: str, port: int, deadline: float, policy: WaitPolicy, log: Callable[[str], None] = print
) -> None:
    def connect(remaining: float) -> None:
        # Connect and close at once: the store (libuv TCPStore server) treats it as a client that left.
        with socket.create_connection((host, port), timeout=max(min(policy.connect_timeout_s, remaining), 0.01)):
            return

    _retry(
        connect,
        deadline,
        policy,
        waiting=lambda error: log(f"maskrcnn-launch: waiting for master {host}:{port} to open ({error})"),
        gave_up=lambda tries, error: (
            f"master {host}:{port} did not accept a TCP connection within {policy.timeout_s:g} s "
            f"({tries} tries; last error: {error}). Is the master's trainer up, and --master-port right?"
        ),
    )


def _retry(
    attempt: Callable[[float], T],
    deadline: float,
    policy: WaitPolicy,
    waiting: Callable[[str], None],
    gave_up: Callable[[int, str], str],
) -> T:
    """Call `attempt(seconds left)` until it succeeds or `deadline` passes, backing off exponentially.
    `waiting` is told of the first failure; `gave_up` words the PeerTimeout."""
    tries, interval = 0, policy.interval_s
    while True:
        tries += 1
        try:
            return attempt(max(deadline - time.monotonic(), 0.0))
        except (OSError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
        if not _sleep_before_retry(deadline, interval):
            raise PeerTimeout(gave_up(tries, error))
        if tries == 1:
            waiting(error)
        interval = min(interval * 2, policy.max_interval_s)


def _sleep_before_retry(deadline: float, interval: float) -> bool:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    time.sleep(min(interval, remaining))
    return True


def _resolve(host: str, timeout_s: float) -> list[str]:
    """getaddrinfo with a deadline: glibc's resolver can block for its own timeouts x attempts, which
    would break the bound, so the lookup runs in a daemon thread we stop waiting for."""
    result: dict[str, object] = {}

    def lookup() -> None:
        try:
            result["ok"] = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=lookup, name=f"resolve-{host}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"lookup still running after {timeout_s:.1f} s")
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    infos = result["ok"]
    return sorted({info[4][0] for info in infos})  # type: ignore[union-attr]
