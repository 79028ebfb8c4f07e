"""Every pod of a topology as a local process on loopback: the multi-machine job on one machine.

Each pod is a real `maskrcnn-launch launch` process with an explicit identity (`--role`,
`--index`, `--master-addr 127.0.0.1`), exactly what a bare node would run, so the demo and the
tests exercise the same start-up path as a cluster. Output lines are prefixed with the pod's RPC
name. Without an explicit `--master-port` the master gets a free loopback port (`peers.free_port`),
so two local jobs, or a test next to one, do not collide over the topology's fixed port. When one
pod fails, pods still waiting for their peers (their trainer not started: nothing to lose) are
stopped at once, and the others get `grace_s` seconds to notice on their own (the trainer exits
when it loses a peer) before they are terminated: the group never hangs.

In a ddp job a worker pod may be lost without ending the job: the trainers' elastic group goes on
without it (docs/elastic.md), so its exit (other than a user error's 2) is reported as a loss, the
others are left running, and with `restart_workers` the pod is started again, as a kubelet or a Job
would, to rejoin at a step boundary. The job's status is then the master's. So a ddp job here is
elastic unless its trainer arguments say `--no-elastic` (`--elastic` is added to them): on a cluster
the chart's jobset.elastic decides, since the workload's failure policy must change with it.

SIGTERM or SIGINT to the runner is passed on once to every pod's process group (the pods run in
sessions of their own, so a terminal's Ctrl-C reaches the runner alone): the trainers stop at their
next step boundary with a checkpoint and exit 75 (EXIT_STOPPED). The runner waits `grace_s` seconds for
them, then exits 75 too when every pod did. A second signal is passed on as well: the pods end at once.

Once the master has ended, the job is done: the other pods get `grace_s` seconds to end on their own, and
one still running then (its peers gone, a process of it frozen by SIGSTOP, or hung) is ended with a line
that names it; it does not change the job's status. The pods' processes themselves are podprocs.py's.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from maskrcnn_launcher.boundary import EXIT_OK, EXIT_STOPPED, EXIT_USER_ERROR
from maskrcnn_launcher.contract import STOP_SIGNALS, end_process_tree, signal_handlers, stopped_pids
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.launch import check_engine_args
from maskrcnn_launcher.peers import LOOPBACK
from maskrcnn_launcher.plan import derive_job
from maskrcnn_launcher.podprocs import LocalPod, PodGroup, signal_all, stop_all
from maskrcnn_launcher.topology import load_topology

ELASTIC_FLAGS = ("--elastic", "--no-elastic")  # the trainer's (maskrcnn_dist's PeersConfig.elastic)
MASTER = "master"  # the master pod's rpc name


def local_pods(
    topology_ref: str | None,
    master_port: int,
    trainer_args: Sequence[str],
    wait_timeout_s: float,
    restart_workers: int = 0,
    launch_options: Sequence[str] = (),
) -> list[LocalPod]:
    """The launch command of every pod of the topology, master first; `launch_options`: more of `launch`'s
    own options for every pod."""
    topology = load_topology(topology_ref)
    check_engine_args(topology.engine, trainer_args)  # before any pod starts
    trainer_args = elastic_by_default(topology.engine, trainer_args)
    if restart_workers and (topology.engine != "ddp" or "--no-elastic" in trainer_args):
        why = "a pipeline's stages cannot take a pod back" if topology.engine != "ddp" else "drop --no-elastic"
        raise LauncherError(
            f"--restart-workers {restart_workers}: a worker started again rejoins an elastic ddp job only ({why})"
        )
    job = derive_job(topology, LOOPBACK, master_port)
    launcher = [sys.executable, "-m", "maskrcnn_launcher", "launch"]
    topology_args = ["--topology", topology_ref] if topology_ref else []
    return [
        LocalPod(
            pod.rpc_name,
            tuple(
                launcher
                + [
                    "--role",
                    pod.role,
                    "--index",
                    str(pod.index),
                    "--master-addr",
                    LOOPBACK,
                    "--master-port",
                    str(master_port),
                    "--wait-timeout",
                    f"{wait_timeout_s:g}",
                    *topology_args,
                    *launch_options,
                    "--",
                    *trainer_args,
                ]
            ),
            replaceable=topology.engine == "ddp" and pod.role == "worker",
        )
        for pod in job.pods
    ]


def elastic_by_default(engine: str, trainer_args: Sequence[str]) -> list[str]:
    """A ddp job's trainer arguments with `--elastic` added, unless they choose already (module docstring)."""
    if engine != "ddp" or any(arg in ELASTIC_FLAGS for arg in trainer_args):
        return list(trainer_args)
    return [*trainer_args, "--elastic"]


@dataclass(frozen=True)
class LocalResult:
    """0 if every pod succeeded, else the first failure's exit status, its pod and its error line."""

    code: int
    pod: str | None = None
    error: str | None = None


def run_local(
    pods: Sequence[LocalPod], grace_s: float, echo: Callable[[str], None] = print, restart_workers: int = 0
) -> LocalResult:
    """Run the pods to completion. A pod's user error (exit 2) stops the others at once: restarting
    them could not help, and the group cannot go on without it. A replaceable pod's other exits are
    losses the job survives; up to `restart_workers` of them in all are started again, while the master
    runs. Once the master has ended, the others get `grace_s` to end too; a pod still running then (lost
    to its peers, frozen or hung) is ended with a line, and does not change the job's status."""
    # SIGTERM/SIGINT to this runner (Ctrl-C, `timeout`, a CI kill) go to the pods, and the loop below
    # waits for them: the handler only records the signal.
    received: list[int] = []
    with signal_handlers(dict.fromkeys(STOP_SIGNALS, lambda signum, _: received.append(signum))):
        group = PodGroup(pods, echo)
        job = _Job(group, grace_s, echo, restart_workers)
        try:
            while group.running():
                job.pass_on(received)
                for name, code in group.new_exits():
                    job.ended(name, code)
                if job.deadline is not None and time.monotonic() > job.deadline:
                    job.end_the_rest()
                    break
                time.sleep(0.2)
        finally:
            stop_all(group.procs.values())
            group.join()
    return job.result(received)


class _Job:
    """What the runner decided so far: the first failure, the deadline of the pods still running and why,
    the signals passed on, the restarts used, and the pods it ended itself after the master's end."""

    def __init__(self, group: PodGroup, grace_s: float, echo: Callable[[str], None], restart_workers: int) -> None:
        self.group, self.grace_s, self.echo, self.restart_workers = group, grace_s, echo, restart_workers
        self.failed: tuple[str, int] | None = None
        self.deadline: float | None = None
        self.master_ended = False
        self.forwarded = 0
        self.restarted = 0
        self.ended_by_runner: set[str] = set()

    def pass_on(self, received: list[int]) -> None:
        """A signal to the runner goes to every pod once (module docstring)."""
        if len(received) <= self.forwarded:
            return
        signum = received[self.forwarded]
        self.forwarded += 1
        if self.forwarded == 1:
            self._end_by(time.monotonic() + self.grace_s)
        self.echo(f"[local] {signal.Signals(signum).name}: passed on to every pod; they get {self.grace_s:g}s to stop")
        signal_all(self.group.procs.values(), signum)

    def ended(self, name: str, code: int) -> None:
        if name in self.ended_by_runner:
            return
        if name == MASTER:
            self.master_ended = True
            self._end_by(time.monotonic() + self.grace_s)
        if code == EXIT_OK or self.failed is not None:
            if name == MASTER:
                self._stop_waiting("the master has ended")
            return
        if self.group.survivable(name, code) and not self.forwarded:
            verb = "left" if code == EXIT_STOPPED else "lost"
            self.echo(f"[local] {name} {verb} ({exit_words(code)}): the others go on without it")
            if code != EXIT_STOPPED:
                self._replace(name)
            return
        self.failed = (name, code)
        grace = 0.0 if code == EXIT_USER_ERROR else self.grace_s
        self._end_by(time.monotonic() + grace)
        self.echo(f"[local] {name} exited with {exit_status(code)}; others get {grace:g}s to stop")
        self._stop_waiting("still waiting for peers")

    def _replace(self, name: str) -> None:
        """A lost worker started again, while the master runs and the budget (shared by every worker) lasts."""
        if self.master_ended:
            self.echo(f"[local] {name} is not started again: the master has ended")
        elif self.restarted < self.restart_workers:
            self.restarted += 1
            self.group.start(name)
            self.echo(f"[local] {name} started again ({self.restarted} of {self.restart_workers})")
        elif self.restart_workers:
            self.echo(
                f"[local] {name} is not started again: --restart-workers {self.restart_workers} (one budget shared "
                "by every worker) is used up"
            )

    def _end_by(self, deadline: float) -> None:
        self.deadline = min(self.deadline if self.deadline is not None else deadline, deadline)

    def _stop_waiting(self, why: str) -> None:
        """Pods whose launcher still waits for the master (their trainer not started): nothing to lose."""
        if waiting := self.group.waiting_for_peers():
            self.echo(f"[local] {', '.join(waiting)}: {why}, stopping now")
            stop_all(self.group.procs[n] for n in waiting)
            if self.failed is None:  # the master's end: theirs is not a loss, nor the job's status
                self.ended_by_runner.update(waiting)

    def end_the_rest(self) -> None:
        """The deadline passed: each pod still running is named, then ended."""
        running = {n: p for n, p in self.group.procs.items() if p.poll() is None}
        if not self.master_ended or self.failed is not None or self.forwarded:
            if running:
                self.echo(f"[local] grace period over: ending {', '.join(running)}")
            return  # the runner's `finally` stops them
        for name, proc in running.items():
            frozen = stopped_pids(proc.pid)
            state = f"frozen: process {frozen[0]} is stopped (SIGSTOP)" if frozen else "hung, or waiting for a peer"
            self.echo(f"[local] {name} still running {self.grace_s:g}s after the master ended ({state}): ending it")
            end_process_tree(proc.pid)
            proc.wait()
            self.ended_by_runner.add(name)

    def result(self, received: list[int]) -> LocalResult:
        codes = {n: p.returncode for n, p in self.group.procs.items() if n not in self.ended_by_runner}
        if codes and set(codes.values()) == {EXIT_STOPPED}:
            self.echo(f"[local] every pod stopped on request, the checkpoint written; exit {EXIT_STOPPED}")
            return LocalResult(EXIT_STOPPED)
        if self.forwarded > 1:  # a second signal ended the pods at once
            second = signal.Signals(received[1]).name
            return LocalResult(128 + received[1], None, f"stopped at once by a second {second}")
        failed = self.failed
        if failed is None:
            kept = {n: c for n, c in codes.items() if not self.group.survivable(n, c)}
            failed = next(((n, c) for n, c in kept.items() if c), None)
        if failed is None:
            return LocalResult(EXIT_OK)
        name, code = failed
        killed = f"{exit_words(code)} (exit {exit_status(code)})" if code < 0 else None  # its status alone hides why
        return LocalResult(exit_status(code), name, self.group.errors.get(name) or killed)


def exit_status(code: int) -> int:
    """A process's return code as a shell's status: a signal's death (-n) is 128 + n."""
    return 128 - code if code < 0 else code


def exit_words(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
