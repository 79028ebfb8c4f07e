"""The processes of `maskrcnn-launch local`'s pods: each started in a session of its own (a terminal's Ctrl-C
reaches the runner alone), its output pumped to the runner's with the pod's name, its `error:` line kept;
signals to a pod, and its end: SIGTERM to its process group, then SIGKILL to its whole process tree (a
ddp pod's ranks are in sessions of their own, torchrun's), at once where a process of it is frozen.
local.py decides what happens to them."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from maskrcnn_launcher.boundary import EXIT_OK, EXIT_USER_ERROR
from maskrcnn_launcher.contract import end_process_tree, stopped_pids
from maskrcnn_launcher.launch import EXEC_MARK

STOP_WAIT_S = 10.0  # what a pod gets between SIGTERM and SIGKILL when the runner stops it


@dataclass(frozen=True)
class LocalPod:
    name: str  # rpc name: master, worker1, ...
    argv: tuple[str, ...]
    replaceable: bool = False  # a ddp worker: the group goes on without it, and takes it back


class PodGroup:
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


def signal_all(procs: Iterable[subprocess.Popen], signum: int) -> None:
    """`signum` to each still-running pod's process group."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signum)
            except ProcessLookupError:  # exited meanwhile
                pass


def stop_all(procs: Iterable[subprocess.Popen]) -> None:
    """SIGTERM each still-running pod's process group, then SIGKILL what is left of its process tree after
    STOP_WAIT_S: a frozen pod at once (SIGTERM stays pending in a stopped process), and its ranks too, which
    torchrun starts in sessions of their own."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        if stopped_pids(p.pid):
            end_process_tree(p.pid)
        else:
            signal_all([p], signal.SIGTERM)
    end = time.monotonic() + STOP_WAIT_S
    for p in alive:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            end_process_tree(p.pid)
            p.wait()
