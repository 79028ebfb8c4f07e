"""`maskrcnn-launch local`: every pod of a topology as a real launch process on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import STAND_IN, TOPOLOGY, clean_env


def run_local(tmp_path: Path, trainer: str, *extra: str, timeout: float = 90) -> subprocess.CompletedProcess:
    (tmp_path / "topology.yaml").write_text(TOPOLOGY)
    script = tmp_path / "trainer.py"
    script.write_text(trainer)
    env = {**clean_env(), "MASKRCNN_TRAINER_CMD": f"{sys.executable} {script}"}
    argv = [
        sys.executable,
        "-m",
        "maskrcnn_launcher",
        "local",
        "--topology",
        str(tmp_path / "topology.yaml"),
        # No --master-port: `local` picks a free loopback port itself (the topology says 29500).
        "--wait-timeout",
        "30",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_pod_runs_with_its_own_identity(tmp_path: Path) -> None:
    result = run_local(tmp_path, STAND_IN)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = {}
    for line in result.stdout.splitlines():
        name, _, rest = line.partition("] ")
        if rest.startswith("{"):
            reports[name.lstrip("[")] = json.loads(rest)
    assert {name: r["env"]["RANK"] for name, r in reports.items()} == {"master": "0", "worker1": "1", "worker2": "2"}
    assert all(r["env"]["MASTER_ADDR"] == "127.0.0.1" and r["env"]["WORLD_SIZE"] == "3" for r in reports.values())
    ports = {r["env"]["MASTER_PORT"] for r in reports.values()}
    assert len(ports) == 1 and ports != {"29500"}, ports  # one port for all, picked free, not the topology's
    assert reports["master"]["hello"] == [1, 2]  # both workers reached the master's port


FAILING = STAND_IN.replace(
    "import json, os, socket, sys",
    "import json, os, socket, sys, time\n"
    "if os.environ['RANK'] == '2': sys.exit(5)\n"
    "if os.environ['RANK'] == '1': time.sleep(600)",
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_failed_pod_stops_the_group_within_the_grace_period(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_local(tmp_path, FAILING, "--grace", "2")
    assert result.returncode == 5, result.stdout + result.stderr
    assert "worker2 exited with 5" in result.stdout
    assert time.monotonic() - started < 60  # worker1 (sleeping 600 s) and the master were terminated


MASTER_FAILS_AT_ONCE = STAND_IN.replace(
    "import json, os, socket, sys",
    "import json, os, socket, sys\nif os.environ['RANK'] == '0': sys.exit(2)",
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pods_still_waiting_for_peers_are_stopped_at_once(tmp_path: Path) -> None:
    """A master that fails before opening its port (a bad --data-path): the workers, still waiting
    for it in their launchers, have nothing to lose and are stopped without the grace period."""
    started = time.monotonic()
    result = run_local(tmp_path, MASTER_FAILS_AT_ONCE, "--grace", "60")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "master exited with 2" in result.stdout
    assert "worker1, worker2: still waiting for peers, stopping now" in result.stdout
    assert time.monotonic() - started < 25  # neither the 60 s grace nor the 30 s port wait


# The master opens its port (the workers' launchers wait for it), then every trainer runs; worker 1 finds
# a user error while the others are busy.
USER_ERROR_WHILE_OTHERS_TRAIN = """
import os, socket, sys, time
rank = os.environ["RANK"]
if rank == "0":
    server = socket.create_server(("127.0.0.1", int(os.environ["MASTER_PORT"])))
if rank == "1":
    print("error: --data-path /x: no train split found", flush=True)
    sys.exit(2)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_user_error_stops_the_group_at_once_with_its_line(tmp_path: Path) -> None:
    """Exit 2 cannot be helped by waiting: the other pods (already training) get no grace period, and
    the runner's stderr is the failing pod's one error line."""
    started = time.monotonic()
    result = run_local(tmp_path, USER_ERROR_WHILE_OTHERS_TRAIN, "--grace", "60")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == ["error: worker1: --data-path /x: no train split found"]
    assert time.monotonic() - started < 40  # not the 60 s grace, not the 600 s sleep
