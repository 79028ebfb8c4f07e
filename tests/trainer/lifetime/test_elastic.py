"""lifetime/elastic.py with real processes on loopback: a toy job of three members (elastic_member.py)
loses one, admits it again (not the replacement that died waiting), drains one, stops when its leader is
asked to, redoes a step that failed on one member only, and survives random kills; every run must end with the weights
of an uninterrupted one-process run (no step lost, none applied twice, none applied by some replicas
only) and every member's replica equal to the leader's."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from maskrcnn_launcher.contract import parse_membership_line
from maskrcnn_launcher.peers import free_port

from maskrcnn_dist.lifetime.elastic import ElasticGroup
from maskrcnn_dist.lifetime.membership import KEY_PREFIX

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from elastic_member import POLICY, RELEASE, reference  # noqa: E402

pytestmark = pytest.mark.timeout(240)


class Job:
    """A TCPStore (what torchrun's agent hosts on the master's pod) and member processes."""

    def __init__(self, out: Path, world: int = 3, steps: int = 60, step_s: float = 0.1) -> None:
        self.out, self.world, self.steps, self.step_s = out, world, steps, step_s
        self.port = free_port()
        self.store = dist.TCPStore("127.0.0.1", self.port, is_master=True, wait_for_workers=False)
        self.procs: dict[int, subprocess.Popen] = {}
        self.exits: list[tuple[int, int]] = []  # (member, code) of every process that ended
        self.elastic_store = dist.PrefixStore(KEY_PREFIX, self.store)
        self.tickets_seen = 0

    def start(self, member: int, env: dict[str, str] | None = None) -> None:
        args = [sys.executable, str(HERE / "elastic_member.py"), "127.0.0.1", str(self.port), str(member)]
        args += [str(self.world), str(self.steps), str(self.out), str(self.step_s)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        log = open(self.out / f"member{member}.log", "a")
        self.procs[member] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)

    def records(self, member: int) -> list[dict]:
        path = self.out / f"member{member}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(r["step"] >= step for r in self.records(0)):
            assert self.procs[0].poll() is None, self.log(0)
            assert time.monotonic() < deadline, f"step {step} not reached: {self.log(0)}"
            time.sleep(0.05)

    def wait_until(self, done: Callable[[], bool], timeout: float = 120, poll: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"not done within {timeout:g}s: {self.log(0)}"
            time.sleep(poll)

    def wait_for_ticket(self, member: int) -> int:
        """The join ticket of `member`'s newest process, once it has asked (membership.py's keys)."""
        store, deadline = self.elastic_store, time.monotonic() + 120
        while True:
            ticket = self.tickets_seen + 1
            if store.add("joins", 0) >= ticket and store.check([f"join/{ticket}"]):
                self.tickets_seen = ticket
                if int(store.get(f"join/{ticket}")) == member:
                    return ticket
                continue
            assert time.monotonic() < deadline, self.log(member)
            time.sleep(0.002)

    def release(self) -> None:
        """The test's faults are done: the members stop pacing their steps (elastic_member.RELEASE)."""
        (self.out / RELEASE).write_text("")

    def signal(self, member: int, signum: int) -> None:
        self.procs[member].send_signal(signum)
        self.exits.append((member, self.procs[member].wait(timeout=60)))

    def finish(self, timeout: float = 180) -> dict[int, int]:
        codes = {m: p.wait(timeout=timeout) for m, p in self.procs.items()}
        return codes

    def changes(self) -> list[tuple[str, int]]:
        """(event, rank) of each change of membership the leader logged, as `status` reads them."""
        lines = (self.out / "member0.log").read_text().splitlines()
        return [(c["event"], c["rank"]) for line in lines if (c := parse_membership_line(line))]

    def log(self, member: int) -> str:
        return (self.out / f"member{member}.log").read_text()[-3000:]

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    made = Job(tmp_path, steps=100)
    yield made
    made.close()


@pytest.mark.slow
def test_survivors_go_on_and_a_replacement_rejoins_after_one_that_died_waiting(tmp_path: Path) -> None:
    """Member 2 killed: the survivors go on at two. Its first replacement dies once it has asked to join:
    the leader does not admit it (its ticket's holder is silent). The second one is admitted, receives
    the state, and the group ends whole at three with the uninterrupted run's weights."""
    job = Job(tmp_path, steps=300)  # paced until the faults are done (elastic_member.RELEASE)
    try:
        _survivors_go_on_and_a_replacement_rejoins(job)
    finally:
        job.close()


def _survivors_go_on_and_a_replacement_rejoins(job: Job) -> None:
    for member in range(job.world):
        job.start(member)
    job.wait_for_step(8)
    killed_at = time.monotonic()
    job.signal(2, signal.SIGKILL)
    steps_before = max(r["step"] for r in job.records(0))
    job.wait_for_step(steps_before + 1)
    first_step_after = time.monotonic() - killed_at
    job.start(2)  # its pod started again, as a kubelet would
    ticket = job.wait_for_ticket(2)  # it asked to join: kill it before the leader's next boundary
    job.signal(2, signal.SIGKILL)
    job.wait_until(lambda: job.elastic_store.check([f"admitted/{ticket}"]))
    assert "fell silent" in job.elastic_store.get(f"admitted/{ticket}").decode()
    assert "asked to join but fell silent: not admitted" in job.log(0)
    job.start(2)  # started again once more: this one is admitted
    job.wait_until(lambda: (last := job.records(0)[-1])["size"] == 3 and last["generation"] > 1)
    job.release()
    codes = job.finish()
    assert codes == {0: 0, 1: 0, 2: 0}, job.log(0)
    assert job.exits == [(2, -signal.SIGKILL)] * 2
    leader = job.records(0)
    assert [r["step"] for r in leader] == list(range(1, job.steps + 1)), "a step lost or done twice"
    assert leader[-1]["weights"] == pytest.approx(reference(job.steps), abs=1e-5)
    sizes = [r["size"] for r in leader]
    assert 2 in sizes and sizes[-1] == 3, sizes  # went on with two, grew back to three
    assert job.records(1)[-1]["weights"] == leader[-1]["weights"]
    assert job.records(2)[-1]["weights"] == leader[-1]["weights"]  # the replacement got the state
    assert job.changes() == [("lost", 2), ("joined", 2)]  # the replacement that died was never admitted
    # dead_after 1 s + regroup + a redone step (1.16 s seen); a formation stalled until the policy's
    # 60 s timeout fails. The figure itself is benchmarks/bench_elastic_loss.py's.
    assert first_step_after < 30, first_step_after


@pytest.mark.slow
def test_a_drained_member_leaves_alone_with_exit_75_then_the_leaders_stop_stops_everyone(job: Job) -> None:
    """SIGTERM to member 1: it leaves at a step boundary with exit 75 and the others train on at two,
    every step the uninterrupted run's; then SIGTERM to the leader: every member left stops at the same
    step with exit 75, before the run's end."""
    for member in range(job.world):
        job.start(member)
    job.wait_for_step(5)
    job.signal(1, signal.SIGTERM)
    assert job.exits == [(1, 75)], job.log(1)
    left_at = job.records(1)[-1]["step"]
    job.wait_for_step(left_at + 2)
    job.procs[0].send_signal(signal.SIGTERM)
    codes = job.finish()
    assert codes == {0: 75, 1: 75, 2: 75}, job.log(0)
    leader = job.records(0)
    last = leader[-1]["step"]
    assert [r["step"] for r in leader] == list(range(1, last + 1)) and last < job.steps
    assert [r["size"] for r in leader[left_at:]] == [2] * (last - left_at)
    assert leader[-1]["weights"] == pytest.approx(reference(last), abs=1e-5)
    assert job.changes() == [("left", 1)]
    assert job.records(2)[-1]["step"] == last and job.records(2)[-1]["weights"] == leader[-1]["weights"]
    # It left at a boundary: its last step is one every member finished.
    assert job.records(1)[-1]["weights"] == leader[left_at - 1]["weights"]


@pytest.mark.slow
def test_no_member_steps_unless_every_member_finished_the_step(tmp_path: Path) -> None:
    """Member 1's step 6 fails after an all-reduce that succeeded on the others: without the commit point
    they would step and member 1 would not, and the replicas would differ from then on."""
    job = Job(tmp_path, step_s=0.0)  # nothing to wait for: no pacing
    try:
        job.start(0)
        job.start(1, env={"ELASTIC_FAIL_AFTER_REDUCE": "5"})
        job.start(2)
        codes = job.finish()
        assert codes == {0: 0, 1: 0, 2: 0}, job.log(1)
        leader = job.records(0)
        assert [r["step"] for r in leader] == list(range(1, job.steps + 1))
        assert leader[5]["generation"] == 1  # step 6 was redone in a new generation of the same three
        for member in (1, 2):
            assert job.records(member)[-1]["weights"] == leader[-1]["weights"]
        assert leader[-1]["weights"] == pytest.approx(reference(job.steps), abs=1e-5)
    finally:
        job.close()


@pytest.mark.slow
# real_processes: a replacement forked at once (no torch import) rejoins within milliseconds of its
# predecessor's SIGKILL, and the group then fails to form ("member 2 did not come to form generation
# 3", seen under tests/zygote.py): a race of the elastic group with a replacement faster than any pod's,
# not fixed yet; this test keeps the start-up time a real process has.
@pytest.mark.real_processes
def test_chaos_random_workers_killed_and_started_again(tmp_path: Path) -> None:
    job = Job(tmp_path, world=3, steps=160, step_s=0.1)
    try:
        for member in range(job.world):
            job.start(member)
        seed = int(os.environ.get("ELASTIC_CHAOS_SEED", "7"))
        chance = random.Random(seed)
        # The seed picks which member goes first and the pauses; the same member twice in a row (its
        # replacement killed again), then the other, are there by construction.
        first = chance.choice([1, 2])
        victims = [first, first, 3 - first]
        print(f"chaos (ELASTIC_CHAOS_SEED={seed}): members killed in turn: {victims}", flush=True)
        for round_, victim in enumerate(victims):
            job.wait_for_step(8 + 30 * round_)  # 3 s of steps: past the dead time and the regroup
            lines = len(job.records(victim))
            job.signal(victim, signal.SIGKILL)
            time.sleep(chance.uniform(0.0, 1.5))
            job.start(victim)
        # The last replacement in and stepping (its lines follow its predecessor's), or the run over without
        # it (a loaded machine: it then exits 0, nothing to join); then the rest of the steps unpaced. Not
        # "a generation more": an earlier victim's late replacement is one as well.
        job.wait_until(lambda: job.procs[0].poll() is not None or len(job.records(victim)) > lines)
        job.release()
        codes = job.finish()
        assert codes == {0: 0, 1: 0, 2: 0}, (victims, job.log(0))
        leader = job.records(0)
        assert [r["step"] for r in leader] == list(range(1, job.steps + 1)), victims
        assert leader[-1]["weights"] == pytest.approx(reference(job.steps), abs=1e-5)
        assert [m for m, code in job.exits] and all(code == -signal.SIGKILL for _, code in job.exits)
    finally:
        job.close()


def test_a_replacement_that_finds_the_run_over_closes_its_watcher(tmp_path: Path) -> None:
    """In one process: a store past generation 0 whose leader finished. The joiner's start() answers None
    and its watcher thread is gone: left beating, it aborted a replacement's process at exit (SIGABRT)."""
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    store = dist.PrefixStore(KEY_PREFIX, server)
    store.set("gen", "0")
    store.set("finished", "1")
    group = ElasticGroup("127.0.0.1", port, 1, 3, "gloo", POLICY)
    try:
        assert group.start() is None
        assert not group.watcher._thread.is_alive()
    finally:
        group.close()
