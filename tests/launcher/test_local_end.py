"""`maskrcnn-launch local` ends when the job is done: once the master has ended, a pod that is frozen
(SIGSTOP) or hung is ended after --grace with a line naming it, its whole process tree with it, and the
runner's status is the job's; the --restart-workers budget is one for every worker and its end is said."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from maskrcnn_launcher.contract.processes import process_state
from topologies import CPU_DDP_TOPOLOGY

from .conftest import TOPOLOGY, clean_env

# Each trainer writes its pid; the master (rank 0) opens MASTER_PORT for the workers' launchers (a pipeline
# topology's: under torchrun the agent's store does), waits
# until every trainer has started, and finishes. Rank 2 then freezes itself, rank 1 hangs.
FROZEN_AND_HUNG = """
import os, pathlib, signal, socket, sys, time
here = pathlib.Path(sys.argv[1])
rank = os.environ["RANK"]
(here / f"pid{rank}").write_text(str(os.getpid()))
if rank == "0":
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # under torchrun its store holds the port already
        server = socket.create_server(("127.0.0.1", int(os.environ["MASTER_PORT"])))
    while not all((here / f"pid{r}").exists() for r in ("1", "2")):
        time.sleep(0.05)
    print("master done", flush=True)
    sys.exit(0)
if rank == "2":
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(600 if rank == "1" else 0)
"""


def run_local(tmp_path: Path, topology: str, trainer: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "topology.yaml").write_text(topology)
    (tmp_path / "trainer.py").write_text(trainer)
    env = {**clean_env(), "MASKRCNN_TRAINER_CMD": f"{sys.executable} {tmp_path / 'trainer.py'} {tmp_path}"}
    argv = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(tmp_path / "topology.yaml")]
    try:  # the 600 s sleep and the frozen process would outlive the 150 s bound: the runner must end them
        return subprocess.run(
            [*argv, "--wait-timeout", "60", *extra], capture_output=True, text=True, env=env, timeout=150
        )
    finally:  # whatever the runner left (a failing run): no trainer outlives the test
        for pid_file in tmp_path.glob("pid*"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
                if str(tmp_path) in Path(f"/proc/{pid}/cmdline").read_text():  # still this test's trainer
                    os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")


def gone(pid: int) -> bool:
    """`pid` dead within 5 s (a SIGKILL is delivered asynchronously: moments)."""
    for _ in range(500):
        if not alive(pid):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_frozen_and_a_hung_pod_are_ended_after_the_master_and_the_job_succeeds(tmp_path: Path) -> None:
    result = run_local(tmp_path, TOPOLOGY, FROZEN_AND_HUNG, "--grace", "2")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "[master] master done" in out
    frozen = int((tmp_path / "pid2").read_text())
    assert f"[local] worker2 still running 2s after the master ended (frozen: process {frozen} is stopped" in out
    assert "[local] worker1 still running 2s after the master ended (hung, or waiting for a peer): ending it" in out
    assert "error:" not in result.stderr, result.stderr
    assert all(gone(int((tmp_path / f"pid{r}").read_text())) for r in (1, 2))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_frozen_ddp_rank_under_torchrun_is_ended_with_its_pod(tmp_path: Path) -> None:
    """torchrun starts each rank in a session of its own: ending the pod's process group would leave the
    frozen rank behind. The master's status (0) is the job's."""
    trainer = FROZEN_AND_HUNG.replace('600 if rank == "1" else 0', "0")  # rank 1 finishes with the master
    result = run_local(tmp_path, CPU_DDP_TOPOLOGY, trainer, "--grace", "2")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    frozen = int((tmp_path / "pid2").read_text())
    assert f"[local] worker2 still running 2s after the master ended (frozen: process {frozen} is stopped" in out
    assert "worker1 still running" not in out
    assert gone(frozen)
    # A planned end is quiet: the agents that waited for worker2 at the end say so in one line each, without
    # torch's exit-barrier traceback or the C++ frames of its store's closing socket. The master's agent, which
    # hosts the store, waits the 10 s out; worker1's does too, or sees the store go first (whichever comes first).
    ends = ("not every pod reached the end within 10 s", "the master's pod ended first")
    said = [line for line in out.splitlines() if any(end in line for end in ends)]
    assert sorted(line.split("]")[0] for line in said) == ["[master", "[worker1"], out
    assert ends[0] in next(line for line in said if line.startswith("[master]")), out
    for noise in ("Traceback", "Error waiting on exit barrier", "frame #", "TCPStore.cpp", "socket.cpp"):
        assert noise not in out + result.stderr, out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_master_killed_by_a_signal_is_the_job_s_status_as_a_shell_gives_it(tmp_path: Path) -> None:
    """The master's pod is its trainer (the launcher execs it): killed by SIGKILL, the job's status is a
    shell's 128 + 9, not Python's sys.exit(-9) (247), and the hung workers are ended with it."""
    trainer = FROZEN_AND_HUNG.replace("    sys.exit(0)", "    os.kill(os.getpid(), signal.SIGKILL)").replace(
        'if rank == "2":\n    os.kill(os.getpid(), signal.SIGSTOP)\n', ""
    )
    trainer = trainer.replace('600 if rank == "1" else 0', "600")
    result = run_local(tmp_path, TOPOLOGY, trainer, "--grace", "2")
    assert result.returncode == 128 + signal.SIGKILL, result.stdout + result.stderr
    assert result.stderr.splitlines()[-1] == "error: master: killed by SIGKILL (exit 137)", result.stderr
    assert all(gone(int((tmp_path / f"pid{r}").read_text())) for r in (1, 2))


# Workers 1 and 2 each crash on their first run; a run started again finishes. The master finishes once
# both have crashed and one has come back.
BOTH_CRASH_ONCE = """
import os, pathlib, sys, time
here = pathlib.Path(sys.argv[1])
rank = os.environ["RANK"]
if rank != "0":
    if not (here / f"crashed{rank}").exists():
        (here / f"crashed{rank}").touch()
        sys.exit(1)
    (here / f"back{rank}").touch()
    sys.exit(0)
deadline = time.monotonic() + 100
while time.monotonic() < deadline and not (
    all((here / f"crashed{r}").exists() for r in "12") and any((here / f"back{r}").exists() for r in "12")
):
    time.sleep(0.1)
print("master done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_restart_budget_is_shared_by_every_worker_and_its_end_is_said(tmp_path: Path) -> None:
    result = run_local(tmp_path, CPU_DDP_TOPOLOGY, BOTH_CRASH_ONCE, "--restart-workers", "1")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert out.count("started again (1 of 1)") == 1, out
    lines = [line for line in out.splitlines() if "is not started again" in line]
    assert len(lines) == 1 and "--restart-workers 1 (one budget shared by every worker) is used up" in lines[0], out
    assert len(list(tmp_path.glob("back*"))) == 1


def test_local_help_says_the_restart_budget_is_shared_and_shows_its_default() -> None:
    from click.testing import CliRunner
    from maskrcnn_launcher.cli import main

    text = " ".join(CliRunner().invoke(main, ["local", "--help"], env=clean_env()).output.split())
    assert "one budget shared by every worker" in text
    assert "--restart-workers N" in text and "[default: 0" in text.split("--restart-workers N", 1)[1][:400]


@pytest.mark.slow
def test_a_process_tree_is_ended_whole_frozen_members_included(tmp_path: Path) -> None:
    """contract.end_process_tree reaches a child that left its parent's session and is stopped."""
    from maskrcnn_launcher.contract import end_process_tree, process_tree, stopped_pids

    code = (
        "import os, signal, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import os, signal; os.kill(os.getpid(), signal.SIGSTOP)'],"
        " start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        while not stopped_pids(parent.pid):
            time.sleep(0.01)
        assert process_tree(parent.pid) == [parent.pid, child] and stopped_pids(parent.pid) == [child]
        end_process_tree(parent.pid)
        assert parent.wait(timeout=10) == -9
        assert gone(child)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
