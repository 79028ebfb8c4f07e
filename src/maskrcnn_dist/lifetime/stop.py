"""Stopping at a step boundary on SIGTERM or SIGINT, with a checkpoint of the last finished step.

Kubernetes says "this pod goes away" with SIGTERM, then waits terminationGracePeriodSeconds before
SIGKILL. So the first SIGTERM (or Ctrl-C's SIGINT) only sets a flag here. The Trainer (loop.py) reads
it at each step boundary and after each validation or evaluation batch, writes the checkpoint and
raises `Stopped`; the entry point logs its closing line and exits EXIT_STOPPED (75). How the
processes of an engine agree on the step (engines/):
  local     this process decides;
  ddp       the flag rides in the step's all-reduce of the loss terms: every rank sees the same sum,
            so every rank stops after the same step; rank 0 writes the checkpoint;
  pipeline  a stage worker passes its request to the master over RPC; the master stops, gathers and
            writes the checkpoint, then ends the session, which lets the workers go with exit 75.

A second SIGTERM/SIGINT ends the process at once, by that signal (the shell's 128 + n): the step in
progress is lost, the newest checkpoint is intact (checkpoint.py writes atomically). Once this
process's part of a stop is done (its checkpoint written), any further signal exits 75 at once.

FORWARDED_STOP (SIGUSR1) is the same request passed on by a supervisor (the torchrun wrapper,
torchrun.py). It never counts as a second signal, so a rank that gets a stop both ways (a signal sent
to every process of the job, and the wrapper's forward) stops once.

A process has one StopRequest, made and installed for these signals once, by its entry point, with
`stop_on_signals()`: cli/run.py's train and eval (pipeline stage workers run train too) and demo's local
run; the torchrun wrapper takes them itself and forwards them to its ranks (RankStopper). From there
it is handed down: `train()` and the Trainer receive it, the engines at their construction, and on a
pipeline process the runtime's session registers it for its peers' RPC calls for as long as the
session runs (engines/pipeline/runtime.py). Which signals stop a process, and the one way to take
them for a while (`signal_handlers`), are the launcher's contract (maskrcnn_launcher.contract).
Standard library only: the CLI installs the handlers before torch loads.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

from maskrcnn_launcher.contract import EXIT_STOPPED, FORWARDED_STOP, STOP_SIGNALS, signal_handlers


class StopRequest:
    """Whether this process was asked to stop, by what and since when; fed by signal handlers and by
    peers (a ddp rank's agreement, a pipeline worker's message to its master)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.reason: str | None = None  # what asked first: "SIGTERM", "SIGTERM on worker2", ...
        self.since: float | None = None  # when, on `clock`: the closing line's "seconds to stop"
        self.done = False  # this process's part of the stop is done: it only exits now
        self.saved = ""  # what it saved, for the closing line
        self._clock = clock
        self._direct_signals = 0  # STOP_SIGNALS received (a forward does not count)

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        """Ask to stop (idempotent: the first reason and time are kept)."""
        if self.reason is None:
            self.reason, self.since = reason, self._clock()

    def finish(self, saved: str) -> None:
        """This process's part is done (`saved`: the checkpoint written, or why none): further signals exit 75."""
        self.done, self.saved = True, saved

    def seconds(self) -> float:
        """Seconds since the request: what the closing line reports."""
        return 0.0 if self.since is None else self._clock() - self.since

    # -- signals ---------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Runs in the main thread between two bytecodes, wherever it was: no locks, no buffered
        # stream (a half-written log line would make the stream raise), only flags and os.write.
        name = signal.Signals(signum).name
        if self.done:
            _say(f"{name}: the checkpoint is written; exiting now")
            os._exit(EXIT_STOPPED)
        if signum != FORWARDED_STOP:
            self._direct_signals += 1
            if self._direct_signals > 1:
                _die_by(signum, f"second {name}: exiting now, the step in progress lost, the newest checkpoint intact")
        self.request(name if signum != FORWARDED_STOP else f"{name} (a stop forwarded by torchrun)")


@contextmanager
def stop_on_signals(clock: Callable[[], float] = time.monotonic) -> Iterator[StopRequest]:
    """This process's StopRequest, fed by SIGTERM, SIGINT and FORWARDED_STOP for the body (main thread
    only, as Python requires): what a process's entry point does once. The torchrun wrapper starts its
    ranks with FORWARDED_STOP blocked, so that a forward sent while a rank still starts up waits instead
    of killing it (SIGUSR1's default action): unblocked here, it arrives now.

    On leaving, the previous handlers are back, unless a stop was requested: the process is then on its
    way out with EXIT_STOPPED, and a late duplicate (a supervisor ending its children) must not kill it."""
    stop = StopRequest(clock)
    with signal_handlers(dict.fromkeys((*STOP_SIGNALS, FORWARDED_STOP), stop._on_signal), keep=lambda: stop.requested):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {FORWARDED_STOP})
        yield stop


def _say(line: str) -> None:
    os.write(2, f"maskrcnn-dist: {line}\n".encode())


def _die_by(signum: int, line: str) -> None:
    """End the process by `signum` itself, as if nothing handled it: its exit status says so."""
    _say(line)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the default action of SIGTERM and SIGINT ends the process


class Interrupted(Exception):  # noqa: N818 (not an error: a loop's way out when its processes agreed to stop)
    """Every process of the engine agreed to stop inside a loop (validation, evaluation) before its end:
    its partial results are dropped, and the Trainer records the loop as pending."""


class Stopped(Exception):  # noqa: N818 (not an error: the way out of a stop, to exit EXIT_STOPPED)
    """This process's part of a stop is done (`request.finish` said what it saved): the entry point logs
    `closing_line()` and exits EXIT_STOPPED."""

    #: What goes on after a stop of the run: its newest checkpoint.
    RESUMES = "--resume auto continues"
    #: What goes on after an elastic member drained alone: the others; this pod, started again, rejoins them.
    REJOINS = "the others train on; started again, this pod rejoins them at a step boundary"

    def __init__(self, request: StopRequest, where: str = "", then: str = RESUMES) -> None:
        super().__init__(request.saved)
        self.request, self.where, self.then = request, where, then

    @classmethod
    def before_any_step(cls, request: StopRequest, where: str) -> Stopped:
        request.finish("no step finished since the start or the newest checkpoint, nothing to save")
        return cls(request, where)

    @classmethod
    def left_group(cls, request: StopRequest, step: int) -> Stopped:
        """An elastic member drained alone (training/elastic_loop.py): the run goes on without it, and its
        --resume is not what continues it."""
        request.finish(f"left the elastic group after step {step}")
        return cls(request, then=cls.REJOINS)

    def closing_line(self) -> str:
        where = f" during {self.where}" if self.where else ""
        return (
            f"stopped by {self.request.reason}{where}: {self.request.saved}; {self.request.seconds():.1f}s from "
            f"the request to exit; exit {EXIT_STOPPED} ({self.then})"
        )


class RunOver(Exception):  # noqa: N818 (not an error: a replacement came when there was nothing to join)
    """An elastic ddp member (lifetime/elastic.py) whose group's run ended before it was admitted, or
    while it waited for the next generation: it leaves with exit 0, nothing trained, nothing lost."""


def exit_stopped(line: str) -> NoReturn:
    """Leave with EXIT_STOPPED after `line` (the closing log line): at once, once the streams are flushed.
    Everything is saved and closed by now, and the interpreter's own teardown (torch's modules) would add
    seconds between the closing line and the exit the pod's grace period is counting."""
    logging.getLogger(__name__).info("%s", line)
    logging.shutdown()  # flushes every handler
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(EXIT_STOPPED)


# ----------------------------------------------------------------------------------------------
# Helper processes the trainer forks.
# ----------------------------------------------------------------------------------------------


def leave_process_group(*_: object) -> None:
    """A DataLoader worker's init (its argument is the worker id): leave the trainer's process group,
    so that a signal sent to the whole group (dumb-init forwards SIGTERM so; a terminal's Ctrl-C;
    `maskrcnn-launch local`) reaches only the trainer. Otherwise it kills the worker and with it the
    batch in progress; the trainer ends its workers itself, and they exit when it dies."""
    os.setpgrp()


def detach_pool_worker() -> None:
    """A multiprocessing pool worker's initializer: out of the trainer's process group (see above),
    with the default SIGTERM and SIGINT of a fresh process: the fork copied the trainer's stop handler,
    under which the pool's own terminate() (a SIGTERM) would leave it running and the trainer waiting."""
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(FORWARDED_STOP, signal.SIG_DFL)
