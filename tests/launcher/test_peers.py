"""Waiting for the master: a late port is waited for; a name that never resolves fails within the bound; and
`maskrcnn-launch wait-master`, the same wait as a command (the chart's helm test)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from maskrcnn_launcher.cli import main
from maskrcnn_launcher.errors import PeerTimeout
from maskrcnn_launcher.peers import WaitPolicy, wait_for_master

# RFC 6761 reserves .invalid: it never resolves, and resolvers answer it locally.
NEVER_RESOLVES = "maskrcnn-master-0.does-not-exist.invalid"
FAST = WaitPolicy(timeout_s=1.0, interval_s=0.05, max_interval_s=0.2, connect_timeout_s=0.2)


@pytest.fixture
def late_listener(free_port: int) -> Iterator[tuple[int, float]]:
    """A real socket that starts listening 0.6 s from now, like a master whose trainer starts late."""
    port, delay = free_port, 0.6
    stop = threading.Event()

    def serve() -> None:
        time.sleep(delay)
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                    conn.close()
                except TimeoutError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, delay
    stop.set()
    thread.join(timeout=2)


def test_port_that_opens_late_is_waited_for(late_listener: tuple[int, float]) -> None:
    port, delay = late_listener
    logs: list[str] = []
    start = time.monotonic()
    wait_for_master("127.0.0.1", port, WaitPolicy(timeout_s=10, interval_s=0.05, max_interval_s=0.2), logs.append)
    elapsed = time.monotonic() - start
    assert delay * 0.8 <= elapsed, elapsed  # it waited for the port (a timeout would have raised)
    assert any("waiting for master 127.0.0.1:" in line for line in logs), logs
    assert any("accepts connections" in line for line in logs)


def test_name_that_never_resolves_fails_within_the_bound() -> None:
    start = time.monotonic()
    with pytest.raises(PeerTimeout) as info:
        wait_for_master(NEVER_RESOLVES, 29500, FAST, lambda _: None)
    elapsed = time.monotonic() - start
    assert elapsed < FAST.timeout_s + 30, elapsed  # bounded by its 1 s, not by the resolver's own retries
    message = str(info.value)
    assert NEVER_RESOLVES in message and "did not resolve within 1 s" in message


def test_port_that_never_opens_fails_within_the_bound(free_port: int) -> None:
    port = free_port  # nothing listens there
    start = time.monotonic()
    with pytest.raises(PeerTimeout, match=rf"master 127\.0\.0\.1:{port} did not accept a TCP connection within 1 s"):
        wait_for_master("127.0.0.1", port, FAST, lambda _: None)
    assert time.monotonic() - start < FAST.timeout_s + 30  # its 1 s; unbounded, it would poll forever


def test_launch_cli_reports_unreachable_master_and_exits_3() -> None:
    result = CliRunner().invoke(
        main,
        ["launch", "--role", "worker", "--index", "0", "--master-addr", NEVER_RESOLVES, "--wait-timeout", "0.5"],
        env={"HOSTNAME": "laptop"},
    )
    assert result.exit_code == 3, result.output
    assert f"error: master {NEVER_RESOLVES!r} did not resolve within 0.5 s" in result.output


def test_launch_cli_rejects_bad_wait_timeout() -> None:
    result = CliRunner().invoke(
        main,
        ["launch", "--role", "worker", "--index", "0", "--master-addr", "h"],
        env={"MASKRCNN_WAIT_TIMEOUT": "soon"},
    )
    assert result.exit_code == 2 and "MASKRCNN_WAIT_TIMEOUT: 'soon' is not a number" in result.output


# -- `maskrcnn-launch wait-master`: the chart's helm test, through the real console script --------------


@pytest.mark.slow
def test_wait_master_succeeds_on_a_listening_port(console) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # the backlog accepts: no accept() needed
        port = server.getsockname()[1]
        result = console("maskrcnn-launch", "wait-master", "--master-addr", "127.0.0.1", "--master-port", str(port))
    assert result.code == 0, result.stderr
    assert result.stdout == f"master reachable at 127.0.0.1:{port}\n"
    assert not [line for line in result.stderr.splitlines() if not line.startswith("maskrcnn-launch: ")]


@pytest.mark.slow
@pytest.mark.parametrize("host", ["127.0.0.1", NEVER_RESOLVES], ids=["port-closed", "name-never-resolves"])
def test_wait_master_times_out_with_one_line_naming_host_and_port(console, free_port: int, host: str) -> None:
    args = ["--master-addr", host, "--master-port", str(free_port), "--timeout", "0.5"]
    started = time.monotonic()
    result = console("maskrcnn-launch", "wait-master", *args, timeout=120)
    assert time.monotonic() - started < 60  # its --timeout 0.5, not the default's minutes
    assert result.code == 3 and result.stdout == "", result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [result.stderr.splitlines()[-1]], result.stderr
    assert errors[0].startswith(f"error: master not reachable at {host}:{free_port}: "), result.stderr
    # The rest is the launcher's own progress (what a worker's `launch` logs while it waits).
    assert all(line.startswith("maskrcnn-launch: ") for line in result.stderr.splitlines()[:-1]), result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ([], "--master-addr"),
        (["--master-addr", " "], "--master-addr"),
        (["--master-addr", "h", "--master-port", "70000"], "--master-port"),
        (["--master-addr", "h", "--master-port", "http"], "--master-port"),
        (["--master-addr", "h", "--timeout", "0"], "--timeout"),
        (["--master-addr", "h", "--timeout", "soon"], "--timeout"),
    ],
)
def test_wait_master_bad_flags_exit_2_naming_the_flag(console, args: list[str], flag: str) -> None:
    console("maskrcnn-launch", "wait-master", *args).assert_one_error_line(2, flag)
