"""A launch rank replaced again and again (docs/elastic.md): each replacement asks in with a ticket of its
own, is admitted once, joins, and trains; the group ends with every step once and the uninterrupted
run's weights. Real processes, the toy member (elastic_member.py) as the trainer: through `maskrcnn-launch
local` (each pod a torchrun, the pod started again by the runner, as a kubelet or a JobSet's Job would;
a pod drained by SIGTERM to its torchrun leaves alone with exit 75), and under torchrun alone (its agent
starting the rank process again, --max-restarts). The members pace their steps until the faults are done
(elastic_member.RELEASE), then run the rest at once."""

from __future__ import annotations

import json
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
from topologies import CPU_DDP_TOPOLOGY

from maskrcnn_dist.torchrun import descendant_pids, parent_pid, trainer_pid

from .test_elastic import HERE, RELEASE, reference

# real_processes: a rank is found by walking torchrun's process tree (trainer_pid) and killed there.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420), pytest.mark.real_processes]

STEPS = 240
STEP_S = 0.25  # the pace until the faults are done: 60 s for them on a loaded machine, none spent after


def read_records(out: Path, member: int) -> list[dict]:
    path = out / f"member{member}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_job(tmp_path: Path, local_args: list[str], at_step: int, faults: Callable[[], None]) -> str:
    """`maskrcnn-launch local` over the 3-pod topology with the toy member training STEPS steps; `faults()`
    once the leader has recorded `at_step`, then the members released; the job's whole output, after
    asserting it exited 0."""
    (tmp_path / "topology.yaml").write_text(CPU_DDP_TOPOLOGY)
    trainer = f"{sys.executable} {HERE / 'elastic_member.py'} env {STEPS} {tmp_path} {STEP_S}"
    env = {**os.environ, "MASKRCNN_TRAINER_CMD": trainer, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(tmp_path / "topology.yaml")]
    log = open(tmp_path / "local.log", "w")
    runner = subprocess.Popen(argv + local_args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not any(r["step"] >= at_step for r in read_records(tmp_path, 0)):
            assert runner.poll() is None and time.monotonic() < deadline, (tmp_path / "local.log").read_text()[-3000:]
            time.sleep(0.1)
        faults()
        (tmp_path / RELEASE).write_text("")
        code = runner.wait(timeout=240)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    out = (tmp_path / "local.log").read_text()
    assert code == 0, out[-4000:]
    return out


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


def assert_every_step_exact(out: Path, changes: list[tuple[str, int]], leader_log: str, size: int = 3) -> None:
    """Every step once at the uninterrupted run's weights, `size` members at the end, each member's last
    record the leader's at that step (the end, or the boundary it left at), and the leader's lines of each
    change in order."""
    leader = read_records(out, 0)
    assert [r["step"] for r in leader] == list(range(1, STEPS + 1)), "a step lost or done twice"
    assert leader[-1]["size"] == size
    assert leader[-1]["weights"] == pytest.approx(reference(STEPS), abs=1e-5)
    for member in (1, 2):
        last = read_records(out, member)[-1]
        assert last["weights"] == leader[last["step"] - 1]["weights"], member
    lines = [c for line in leader_log.splitlines() if (c := parse_membership_line(line))]
    assert [(c["event"], c["rank"]) for c in lines] == changes, lines


def kill_by_pid_file(out: Path) -> Callable[[int], None]:
    return lambda member: os.kill(int((out / f"member{member}.pid").read_text()), signal.SIGKILL)


def test_local_replaces_the_same_worker_twice_then_another_then_drains_it(tmp_path: Path) -> None:
    """Through `maskrcnn-launch local --restart-workers 3`: worker 2's trainer killed, its replacement
    admitted and trained in the whole group, killed again (the second replacement joins as the first did:
    its admission is not the first one's, which is used); then worker 1's, whose replacement joins too
    (two different workers replaced, in both orders: 2 after 2, 1 after 2); then worker 1's pod drained
    by SIGTERM to its torchrun: it leaves at a step boundary with exit 75 and the others finish at two."""
    kill = kill_by_pid_file(tmp_path)

    def drain_worker1() -> None:  # the pod's torchrun, as a kubelet's SIGTERM
        os.kill(parent_pid(int((tmp_path / "member1.pid").read_text())), signal.SIGTERM)
        wait_for(lambda: read_records(tmp_path, 0)[-1]["size"] == 2)

    faults = [replace_worker(tmp_path, 2, kill), replace_worker(tmp_path, 2, kill), replace_worker(tmp_path, 1, kill)]
    out = run_job(
        tmp_path, ["--restart-workers", "3", "--wait-timeout", "120"], 10, lambda: run([*faults, drain_worker1])
    )
    assert "[local] worker2 lost (exit 1): the others go on without it" in out
    assert "[local] worker2 started again (2 of 3)" in out and "[local] worker1 started again (3 of 3)" in out
    assert "[local] worker1 left (exit 75): the others go on without it" in out
    changes = [("lost", 2), ("joined", 2)] * 2 + [("lost", 1), ("joined", 1), ("left", 1)]
    assert_every_step_exact(tmp_path, changes, out, size=2)


def test_torchrun_starts_the_same_rank_again_twice(tmp_path: Path) -> None:
    """Three torchrun agents (one per node, as the launcher starts them) with --max-restarts 2: worker 2's
    agent starts its rank process again after each kill, and each new process rejoins."""
    port, pods = free_port(), []
    member = [sys.executable, str(HERE / "elastic_member.py"), "env", str(STEPS), str(tmp_path), str(STEP_S)]
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
        (tmp_path / RELEASE).write_text("")
        codes = [pod.wait(timeout=240) for pod in pods]
    finally:
        for pod in pods:
            for pid in [pod.pid, *descendant_pids(pod.pid)] if pod.poll() is None else []:
                os.kill(pid, signal.SIGKILL)
    logs = [(tmp_path / f"pod{node}.log").read_text() for node in range(3)]
    assert codes == [0, 0, 0], logs[2][-3000:]
    assert_every_step_exact(tmp_path, [("lost", 2), ("joined", 2)] * 2, logs[0])


def run(faults: list[Callable[[], None]]) -> None:
    for fault in faults:
        fault()
