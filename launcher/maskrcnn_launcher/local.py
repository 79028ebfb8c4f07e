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
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from maskrcnn_launcher.boundary import EXIT_OK, EXIT_STOPPED, EXIT_USER_ERROR
from maskrcnn_launcher.contract import STOP_SIGNALS, signal_handlers
from maskrcnn_launcher.errors import LauncherError
from maskrcnn_launcher.launch import EXEC_MARK, check_engine_args
from maskrcnn_launcher.peers import LOOPBACK
from maskrcnn_launcher.plan import derive_job
from maskrcnn_launcher.topology import load_topology

ELASTIC_FLAGS = ("--elastic", "--no-elastic")  # the trainer's (maskrcnn_dist's PeersConfig.elastic)


@dataclass(frozen=True)
class LocalPod:
    name: str  # rpc name: master, worker1, ...
    argv: tuple[str, ...]
    replaceable: bool = False  # a ddp worker: the group goes on without it, and takes it back


def local_pods(
    topology_ref: str | None,
    master_port: int,
    trainer_args: Sequence[str],
    wait_timeout_s: float,
    restart_workers: int = 0,
) -> list[LocalPod]:
    """The launch command of every pod of the topology, master first."""
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
    losses the job survives; up to `restart_workers` of them are started again."""
    # SIGTERM/SIGINT to this runner (Ctrl-C, `timeout`, a CI kill) go to the pods, and the loop below
    # waits for them: the handler only records the signal.
    received: list[int] = []
    with signal_handlers(dict.fromkeys(STOP_SIGNALS, lambda signum, _: received.append(signum))):
        group = _PodGroup(pods, echo)
        first_failure: int | None = None
        failed_pod: str | None = None
        deadline: float | None = None
        forwarded = 0
        restarted = 0
        try:
            while group.running():
                if len(received) > forwarded:
                    signum = received[forwarded]
                    forwarded += 1
                    if forwarded == 1:
                        deadline = time.monotonic() + grace_s
                    echo(
                        f"[local] {signal.Signals(signum).name}: passed on to every pod; they get {grace_s:g}s to stop"
                    )
                    _signal_all(group.procs.values(), signum)
                for name, code in group.new_exits():
                    if code == EXIT_OK or first_failure is not None:
                        continue
                    if group.survivable(name, code) and not forwarded:
                        verb = "left" if code == EXIT_STOPPED else "lost"
                        echo(f"[local] {name} {verb} (exit {code}): the others go on without it")
                        if code != EXIT_STOPPED and restarted < restart_workers:
                            restarted += 1
                            group.start(name)
                            echo(f"[local] {name} started again ({restarted} of {restart_workers})")
                        continue
                    failed_pod, first_failure = name, code
                    grace = 0.0 if first_failure == EXIT_USER_ERROR else grace_s
                    deadline = min(deadline or float("inf"), time.monotonic() + grace)
                    echo(f"[local] {failed_pod} exited with {first_failure}; others get {grace:g}s to stop")
                    if waiting := group.waiting_for_peers():
                        echo(f"[local] {', '.join(waiting)}: still waiting for peers, stopping now")
                        _stop_all(group.procs[n] for n in waiting)
                if deadline is not None and time.monotonic() > deadline:
                    echo("[local] grace period over: terminating the remaining pods")
                    break
                time.sleep(0.2)
        finally:
            _stop_all(group.procs.values())
            group.join()
    codes = {n: p.returncode for n, p in group.procs.items()}
    if set(codes.values()) == {EXIT_STOPPED}:
        echo(f"[local] every pod stopped on request, the checkpoint written; exit {EXIT_STOPPED}")
        return LocalResult(EXIT_STOPPED)
    if forwarded > 1:  # a second signal ended the pods at once
        return LocalResult(128 + received[1], None, f"stopped at once by a second {signal.Signals(received[1]).name}")
    if first_failure is None:
        kept = {n: c for n, c in codes.items() if not group.survivable(n, c)}
        failed_pod, first_failure = next(((n, c) for n, c in kept.items() if c), (None, EXIT_OK))
    return LocalResult(first_failure or EXIT_OK, failed_pod, group.errors.get(failed_pod) if failed_pod else None)


class _PodGroup:
    """The pods' processes (a pod started again replaces its entry), their output pumps and error lines."""

    def __init__(self, pods: Sequence[LocalPod], echo: Callable[[str], None]) -> None:
        self.pods = {pod.name: pod for pod in pods}
        self.echo = echo
        self.procs: dict[str, subprocess.Popen] = {}
        self.trainer_started: dict[str, threading.Event] = {}
        self.errors: dict[str, str] = {}  # pod -> its last `error: ` line
        self._pumps: list[threading.Thread] = []
        self._seen: set[int] = set()  # pids whose exit was reported
        for name in self.pods:
            self.start(name)

    def start(self, name: str) -> None:
        proc = subprocess.Popen(
            self.pods[name].argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.procs[name], self.trainer_started[name] = proc, threading.Event()
        pump = threading.Thread(
            target=_pump, args=(name, proc, self.echo, self.trainer_started[name], self.errors), daemon=True
        )
        pump.start()
        self._pumps.append(pump)

    def running(self) -> bool:
        return [p.poll() for p in self.procs.values()].count(None) > 0  # poll every pod

    def new_exits(self) -> list[tuple[str, int]]:
        """(pod, exit status) of each process that ended since the last call."""
        ended = [(n, p) for n, p in self.procs.items() if p.poll() is not None and p.pid not in self._seen]
        self._seen.update(p.pid for _, p in ended)
        return [(n, p.returncode) for n, p in ended]

    def survivable(self, name: str, code: int | None) -> bool:
        """A replaceable pod's end that the others go on without: anything but a user error (and success)."""
        return self.pods[name].replaceable and code not in (None, EXIT_OK, EXIT_USER_ERROR)

    def waiting_for_peers(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None and not self.trainer_started[n].is_set()]

    def join(self) -> None:
        for pump in self._pumps:
            pump.join(timeout=5)


def _die_with_parent() -> None:
    """Linux: the pod gets SIGTERM if this runner dies without cleaning up (e.g. SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass  # not Linux/glibc: the SIGTERM handler above is the only safety net


def _pump(
    name: str,
    proc: subprocess.Popen,
    echo: Callable[[str], None],
    trainer_started: threading.Event,
    errors: dict[str, str],
) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("maskrcnn-launch: ") and EXEC_MARK in line:
            trainer_started.set()
        if line.startswith("error: "):  # the boundary's line (boundary.py), kept for the runner's own
            errors[name] = line.removeprefix("error: ").strip()
        echo(f"[{name}] {line.rstrip()}")


def _signal_all(procs, signum: int) -> None:
    """`signum` to each still-running pod's process group."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signum)
            except ProcessLookupError:  # exited meanwhile
                pass


def _stop_all(procs) -> None:
    """SIGTERM each still-running pod's process group, then SIGKILL what is left after 10 s."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + 10
    for p in alive:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
