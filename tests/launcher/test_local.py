"""`maskrcnn-launch local`: every pod of a topology as a real launch process on loopback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from topologies import CPU_DDP_TOPOLOGY

from .conftest import STAND_IN, TOPOLOGY, clean_env


def run_local(
    tmp_path: Path, trainer: str, *extra: str, timeout: float = 90, wait_timeout: str = "30"
) -> subprocess.CompletedProcess:
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
        wait_timeout,
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
    "if os.environ['RANK'] == '1': time.sleep(3600)",
)

# The times below tell a group stopped at once (seconds) from one that waited for a grace period or a
# sleeper (an hour); the bounds lie far from both, so a busy machine cannot decide them.


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_failed_pod_stops_the_group_within_the_grace_period(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_local(tmp_path, FAILING, "--grace", "2", timeout=500)
    assert result.returncode == 5, result.stdout + result.stderr
    assert "worker2 exited with 5" in result.stdout
    assert time.monotonic() - started < 300  # worker1 (sleeping an hour) and the master were terminated


MASTER_FAILS_AT_ONCE = STAND_IN.replace(
    "import json, os, socket, sys",
    "import json, os, socket, sys\nif os.environ['RANK'] == '0': sys.exit(2)",
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pods_still_waiting_for_peers_are_stopped_at_once(tmp_path: Path) -> None:
    """A master that fails before opening its port (a bad --data-path): the workers, still waiting
    for it in their launchers, have nothing to lose and are stopped without the grace period."""
    started = time.monotonic()
    result = run_local(tmp_path, MASTER_FAILS_AT_ONCE, "--grace", "3600", timeout=500, wait_timeout="3600")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "master exited with 2" in result.stdout
    assert "worker1, worker2: still waiting for peers, stopping now" in result.stdout
    assert time.monotonic() - started < 300  # neither the hour's grace nor the hour's port wait


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
time.sleep(3600)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_user_error_stops_the_group_at_once_with_its_line(tmp_path: Path) -> None:
    """Exit 2 cannot be helped by waiting: the other pods (already training) get no grace period, and
    the runner's stderr is the failing pod's one error line."""
    started = time.monotonic()
    result = run_local(tmp_path, USER_ERROR_WHILE_OTHERS_TRAIN, "--grace", "3600", timeout=500)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == ["error: worker1: --data-path /x: no train split found"]
    assert time.monotonic() - started < 300  # not the hour's grace, not the hour's sleep


@contextmanager
def started(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """`argv` running with pipes for the body; killed after it if it still runs."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


# A trainer that stops on SIGTERM as the real one does: the first asks, the checkpoint takes a while (a
# second delivery would arrive meanwhile), then exit 75. The master opens MASTER_PORT for the workers.
STOPPABLE = """
import os, signal, socket, sys, time
received = []
signal.signal(signal.SIGTERM, lambda *_: received.append(1))
if os.environ["RANK"] == "0":
    server = socket.create_server(("127.0.0.1", int(os.environ["MASTER_PORT"])))
print("ready", flush=True)
deadline = time.monotonic() + 60
while not received and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.5)
print(f"stopping after {len(received)} SIGTERM(s)", flush=True)
sys.exit(75)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_to_the_runner_reaches_every_pod_once_and_all_stopping_is_exit_75(tmp_path: Path) -> None:
    (tmp_path / "topology.yaml").write_text(TOPOLOGY)
    (tmp_path / "trainer.py").write_text(STOPPABLE)
    env = {**clean_env(), "MASKRCNN_TRAINER_CMD": f"{sys.executable} {tmp_path / 'trainer.py'}"}
    argv = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(tmp_path / "topology.yaml")]
    with started(argv, env) as runner:
        assert runner.stdout is not None
        lines = []
        while sum(line.endswith("] ready\n") for line in lines) < 3:
            lines.append(runner.stdout.readline())
            assert lines[-1], "".join(lines)
        runner.send_signal(signal.SIGTERM)
        out, err = runner.communicate(timeout=60)
    assert runner.returncode == 75, out + err
    assert out.count("stopping after 1 SIGTERM(s)") == 3, out
    assert "[local] every pod stopped on request" in out and "error:" not in err


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_worker_stopped_while_waiting_for_its_master_exits_75_at_once(tmp_path: Path, free_port: int) -> None:
    (tmp_path / "topology.yaml").write_text(TOPOLOGY)
    argv = [sys.executable, "-m", "maskrcnn_launcher", "launch", "--topology", str(tmp_path / "topology.yaml")]
    argv += ["--role", "worker", "--index", "0", "--master-addr", "127.0.0.1", "--master-port", str(free_port)]
    argv += ["--trainer-cmd", "true", "--wait-timeout", "60"]
    with started(argv, clean_env()) as worker:
        assert worker.stderr is not None
        while "waiting for master" not in (line := worker.stderr.readline()):
            assert line, "the launcher ended before waiting"
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=10)
    assert worker.returncode == 75, err
    assert "SIGTERM while waiting for the master: the trainer had not started, nothing to save; exit 75" in err


DDP_TOPOLOGY = CPU_DDP_TOPOLOGY
# Under torchrun (a ddp pod's trainer): worker 2's first trainer dies (exit 1); its pod, started again,
# says so in a file, which the master waits for before it finishes; worker 1 finishes with the master.
LOST_AND_BACK = """
import os, pathlib, sys, time
here = pathlib.Path(sys.argv[1])
rank = os.environ["RANK"]
if rank == "2":
    if not (here / "first-run").exists():
        (here / "first-run").touch()
        sys.exit(1)
    (here / "back").touch()
deadline = time.monotonic() + 60
while not (here / "back").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
print(f"rank {rank} done", flush=True)
"""


def run_ddp_local(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "topology.yaml").write_text(DDP_TOPOLOGY)
    (tmp_path / "trainer.py").write_text(LOST_AND_BACK)
    env = {**clean_env(), "MASKRCNN_TRAINER_CMD": f"{sys.executable} {tmp_path / 'trainer.py'} {tmp_path}"}
    argv = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(tmp_path / "topology.yaml")]
    return subprocess.run([*argv, "--wait-timeout", "60", *extra], capture_output=True, text=True, env=env, timeout=150)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_lost_ddp_worker_is_started_again_and_the_job_goes_on(tmp_path: Path) -> None:
    result = run_ddp_local(tmp_path, "--restart-workers", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[local] worker2 lost (exit 1): the others go on without it" in result.stdout
    assert "[local] worker2 started again (1 of 1)" in result.stdout
    assert "exited with" not in result.stdout  # nobody was stopped for it
    assert all(f"rank {r} done" in result.stdout for r in (0, 1, 2)), result.stdout


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_without_restarts_a_lost_ddp_worker_stays_lost_and_the_master_decides(tmp_path: Path) -> None:
    (tmp_path / "back").touch()  # the master does not wait for a replacement
    result = run_ddp_local(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[local] worker2 lost (exit 1): the others go on without it" in result.stdout
    assert "started again" not in result.stdout and "rank 0 done" in result.stdout


def test_a_ddp_job_here_is_elastic_unless_its_trainer_arguments_say_otherwise(tmp_path: Path) -> None:
    """The runner treats a lost ddp worker as a loss the others survive, so their trainers must be able to:
    `--elastic` is added to a ddp job's trainer arguments, never to a pipeline's, and a choice given stays."""
    from maskrcnn_launcher.local import local_pods

    (tmp_path / "ddp.yaml").write_text(DDP_TOPOLOGY)
    (tmp_path / "pipeline.yaml").write_text(TOPOLOGY)

    def trainer_args(topology: str, *given: str) -> list[tuple[str, ...]]:
        pods = local_pods(topology, 29500, given, 60.0)
        return [pod.argv[pod.argv.index("--") + 1 :] for pod in pods]

    assert trainer_args(str(tmp_path / "ddp.yaml"), "--epochs", "2") == [("--epochs", "2", "--elastic")] * 3
    assert trainer_args(str(tmp_path / "ddp.yaml"), "--no-elastic") == [("--no-elastic",)] * 3
    assert trainer_args(str(tmp_path / "ddp.yaml"), "--elastic") == [("--elastic",)] * 3
    assert all("--elastic" not in args for args in trainer_args(str(tmp_path / "pipeline.yaml"), "--epochs", "2"))
