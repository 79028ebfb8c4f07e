"""A launch rank replaced again and again (docs/elastic.md): each replacement asks in with a ticket of its
own, is admitted once, joins, and trains; the group ends whole, every step once, with the uninterrupted
run's weights. Real processes, the toy member (elastic_member.py) as the trainer: through `maskrcnn-launch
local` (each pod a torchrun, the pod started again by the runner, as a kubelet or a JobSet's Job would),
and under torchrun alone (its agent starting the rank process again, --max-restarts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from maskrcnn_launcher.contract import parse_membership_line
from maskrcnn_launcher.peers import free_port

from maskrcnn_dist.torchrun import descendant_pids, trainer_pid

from .test_elastic import HERE, reference
from .test_elastic_local import read_records, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

STEPS = 240  # 0.1 s each: time for two replacements to start and be admitted on a loaded machine


def replace_worker(out: Path, member: int, kill: Callable[[int], None]) -> Callable[[], None]:
    """Kill `member`'s trainer (`kill(member)`) once the group is whole, then wait until its replacement
    has joined and trained a step in the whole group again."""

    def fault() -> None:
        wait_for(lambda: read_records(out, 0)[-1]["size"] == 3)
        killed_in = read_records(out, 0)[-1]["generation"]
        kill(member)
        wait_for(lambda: (last := read_records(out, 0)[-1])["size"] == 3 and last["generation"] > killed_in + 1)

    return fault


def wait_for(done: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the group did not become whole again"
        time.sleep(0.05)


def assert_whole_and_exact(out: Path, changes: list[tuple[str, int]], leader_log: str) -> None:
    """Every step once at the uninterrupted run's weights, the group whole at the end with every member
    holding the leader's weights, and the leader's lines of each change in order."""
    leader = read_records(out, 0)
    assert [r["step"] for r in leader] == list(range(1, STEPS + 1)), "a step lost or done twice"
    assert leader[-1]["size"] == 3
    assert leader[-1]["weights"] == pytest.approx(reference(STEPS), abs=1e-5)
    for member in (1, 2):
        assert read_records(out, member)[-1]["weights"] == leader[-1]["weights"], member
    lines = [c for line in leader_log.splitlines() if (c := parse_membership_line(line))]
    assert [(c["event"], c["rank"]) for c in lines] == changes, lines


def kill_by_pid_file(out: Path) -> Callable[[int], None]:
    return lambda member: os.kill(int((out / f"member{member}.pid").read_text()), signal.SIGKILL)


def test_local_replaces_the_same_worker_twice(tmp_path: Path) -> None:
    """Worker 2's trainer killed, its replacement admitted and trained in the whole group, killed again:
    the second replacement joins as the first did (its admission is not the first one's, which is used)."""
    kill = kill_by_pid_file(tmp_path)
    twice = [replace_worker(tmp_path, 2, kill), replace_worker(tmp_path, 2, kill)]
    out = run_job(tmp_path, STEPS, ["--restart-workers", "2", "--wait-timeout", "120"], 10, lambda: run(twice))
    assert "[local] worker2 started again (2 of 2)" in out
    assert_whole_and_exact(tmp_path, [("lost", 2), ("joined", 2)] * 2, out)


def test_local_replaces_two_workers(tmp_path: Path) -> None:
    kill = kill_by_pid_file(tmp_path)
    each = [replace_worker(tmp_path, 1, kill), replace_worker(tmp_path, 2, kill)]
    out = run_job(tmp_path, STEPS, ["--restart-workers", "2", "--wait-timeout", "120"], 10, lambda: run(each))
    assert "[local] worker1 started again (1 of 2)" in out and "[local] worker2 started again (2 of 2)" in out
    assert_whole_and_exact(tmp_path, [("lost", 1), ("joined", 1), ("lost", 2), ("joined", 2)], out)


def test_torchrun_starts_the_same_rank_again_twice(tmp_path: Path) -> None:
    """Three torchrun agents (one per node, as the launcher starts them) with --max-restarts 2: worker 2's
    agent starts its rank process again after each kill, and each new process rejoins."""
    port, pods = free_port(), []
    member = [sys.executable, str(HERE / "elastic_member.py"), "env", str(STEPS), str(tmp_path), "0.1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for node in range(3):
        argv = [sys.executable, "-m", "maskrcnn_dist.torchrun", "--nnodes", "3", "--node-rank", str(node)]
        argv += ["--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
        argv += ["--max-restarts", "2", "--no-python", *member]
        with open(tmp_path / f"pod{node}.log", "w") as log:
            pods.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
    try:
        wait_for(lambda: any(r["step"] >= 10 for r in read_records(tmp_path, 0)))
        kill = lambda rank: os.kill(trainer_pid(pods[rank].pid, rank), signal.SIGKILL)  # noqa: E731
        run([replace_worker(tmp_path, 2, kill), replace_worker(tmp_path, 2, kill)])
        codes = [pod.wait(timeout=240) for pod in pods]
    finally:
        for pod in pods:
            for pid in [pod.pid, *descendant_pids(pod.pid)] if pod.poll() is None else []:
                os.kill(pid, signal.SIGKILL)
    logs = [(tmp_path / f"pod{node}.log").read_text() for node in range(3)]
    assert codes == [0, 0, 0], logs[2][-3000:]
    assert_whole_and_exact(tmp_path, [("lost", 2), ("joined", 2)] * 2, logs[0])


def run(faults: list[Callable[[], None]]) -> None:
    for fault in faults:
        fault()
