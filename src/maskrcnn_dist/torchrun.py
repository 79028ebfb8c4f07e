"""`python -m maskrcnn_dist.torchrun ARGS`: torch's torchrun (same arguments), with the trainer's exit codes
and its stop on SIGTERM/SIGINT.

Exit status. torchrun exits 1 whenever a worker fails, whatever the worker's own exit status, and prints a
page-long ChildFailedError report. A ddp pod's exit status is what Kubernetes and a JobSet act on, so
this keeps the ranks' meaning: 2 when a rank made a user error (already printed as one line by that
rank; a JobSet's podFailurePolicy then fails the job at once instead of restarting the group over the
same mistake), 75 (EXIT_STOPPED) when every rank stopped on request with its checkpoint written, 128 + n
when a second signal n ended the ranks at once, 1 for any other failure. The launcher execs this module
for every ddp pod.

Signals. torch's elastic agent would handle SIGTERM and SIGINT itself: send the same signal to each
rank's process group, SIGKILL whatever is left 30 s later (--shutdown-timeout), and exit 1. Here the
agent keeps SIGHUP and SIGQUIT only (torchrun's --signals-to-handle) and this wrapper takes SIGTERM and
SIGINT (`RankStopper`):
  first   forward FORWARDED_STOP (SIGUSR1) once to each rank (to ranks that start later too): every rank
          stops at the same step boundary (stop.py) and exits 75; the agent sees them exit and reports
          their exit codes as for any other ending, so the ranks decide how long saving takes (the pod's
          grace period bounds it, with SIGKILL);
  second  SIGKILL each rank's process group: the step in progress is lost, the newest checkpoint intact.
The agent starts every rank in a session of its own, so a signal to torchrun's process group (dumb-init
forwards SIGTERM to its child's group; a terminal sends Ctrl-C to its foreground group) reaches torchrun
alone. A rank that is also signalled directly (a signal sent to every process) stops once: the forward
is never a second signal (stop.py).

Exit barrier. Every agent waits at the end until all have finished (it keeps the master's store up for
the others), 300 s by default. A ddp job goes on without a lost worker pod (docs/elastic.md), whose
agent never comes to that barrier: here it waits EXIT_BARRIER_S. The trainers end together (their
process group's last barrier), so the agents that are still there arrive within a second of each other.
A barrier that ends early (a pod lost or drained before the end, or the master's gone first) is a planned
end's: torch's traceback for it is replaced by one line that says which (`exit_barrier_line`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from maskrcnn_launcher.contract import (
    EXIT_RUNTIME,
    EXIT_STOPPED,
    EXIT_USER_ERROR,
    FORWARDED_STOP,
    RANK,
    STOP_SIGNALS,
    child_pids,
    parent_pid,  # noqa: F401 (re-exported: tests and benchmarks find a rank's torchrun by it)
    process_tree,
    signal_handlers,
)


def pod_exit_status(worker_exit_codes: Iterable[int]) -> int:
    """The pod's exit status from its failed workers': a user error on any rank is the user's error (the
    other ranks then fail only because a peer left); every rank stopped on request is a stop; else a crash."""
    codes = set(worker_exit_codes)
    if EXIT_USER_ERROR in codes:
        return EXIT_USER_ERROR
    return EXIT_STOPPED if codes == {EXIT_STOPPED} else EXIT_RUNTIME


def without_stop_signals(signals_to_handle: str) -> str:
    """torchrun's --signals-to-handle without SIGTERM and SIGINT, which RankStopper takes."""
    names = {signal.Signals(s).name for s in STOP_SIGNALS}
    return ",".join(name for name in signals_to_handle.split(",") if name.strip() not in names)


def descendant_pids(root: int) -> list[int]:
    """`root`'s descendants, nearest first (its children, then theirs, ...)."""
    return process_tree(root)[1:]


def trainer_pid(root: int, rank: int) -> int:
    """The trainer process of launch rank `rank` among `root`'s descendants (`root`: a torchrun, a pod, or
    `maskrcnn-launch local`): the nearest one with RANK=`rank` in its environment. torchrun sets RANK for
    each rank process it starts, and the launcher for a pipeline pod's trainer, which replaced it; neither
    exports it to a ddp pod's torchrun, and a rank's own children (DataLoader workers) lie deeper."""
    wanted = f"{RANK}={rank}".encode()
    for pid in descendant_pids(root):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                if wanted in handle.read().split(b"\0"):
                    return pid
        except OSError:  # gone meanwhile, or not ours to read
            continue
    raise LookupError(f"no process with {RANK}={rank} under process {root}")


class RankStopper:
    """SIGTERM/SIGINT to this process: the first is forwarded to every rank as a stop request, a second
    kills the ranks. The handler only records the signal; a thread acts on it, for ranks that exist now
    and ranks the agent starts later."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.received: list[int] = []  # appended by the handler: atomic, no lock needed
        self.period_s = period_s
        self._told: set[int] = set()
        self._killed: list[int] | None = None  # the ranks a second signal killed
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rank-stopper", daemon=True)

    @contextmanager
    def running(self) -> Iterator[RankStopper]:
        """The signals taken and the thread watching for the body; after it, the signals stay taken once
        one came (torchrun is then on its way out: a late one must not kill it), else they are given back."""
        record = dict.fromkeys(STOP_SIGNALS, lambda signum, _frame: self.received.append(signum))
        with signal_handlers(record, keep=lambda: bool(self.received)):
            self._thread.start()
            try:
                yield self
            finally:
                self._closed.set()
                self._thread.join(timeout=5)

    @property
    def exit_status(self) -> int | None:
        """128 + the second signal's number once a second signal ended the ranks, else None."""
        return 128 + self.received[1] if self._killed else None

    def _watch(self) -> None:
        while not self._closed.wait(self.period_s):
            if len(self.received) > 1 and self._killed is None:
                self._killed = child_pids(os.getpid())
                self._say(f"second {signal.Signals(self.received[1]).name}: killing the ranks now")
                for pid in self._killed:
                    _signal(pid, signal.SIGKILL, group=True)
            elif self.received and self._killed is None:
                for pid in set(child_pids(os.getpid())) - self._told:
                    self._told.add(pid)
                    _signal(pid, FORWARDED_STOP, group=False)
                    first = signal.Signals(self.received[0]).name
                    self._say(f"{first}: rank process {pid} stops after its step in progress (a second one kills it)")

    @staticmethod
    def _say(line: str) -> None:
        print(f"maskrcnn-dist torchrun: {line}", file=sys.stderr, flush=True)


def _signal(pid: int, signum: int, group: bool) -> None:
    try:
        if group:  # the agent made each rank the leader of its own process group
            os.killpg(os.getpgid(pid), signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:  # it exited meanwhile
        pass


def is_not_a_stop(record: logging.LogRecord) -> bool:
    """False for the agent's "failed (exitcode: 75)" line: a rank that stopped on request did not fail."""
    return not (record.msg.startswith("failed (exitcode") and record.args and record.args[0] == EXIT_STOPPED)


def exit_barrier_line(record: logging.LogRecord) -> str | None:
    """The one line that says why the agent's exit barrier ended early (torch logs it as an error with a
    traceback, C++ frames included), or None for any other record. It is a planned end's, not a failure's:
    the pod's status is its ranks' whatever the barrier gave."""
    if not (isinstance(record.msg, str) and record.msg.startswith("Error waiting on exit barrier")):
        return None
    failure = type(record.exc_info[1]).__name__ if record.exc_info and record.exc_info[1] else ""
    if failure == "DistNetworkError":  # the master's agent hosted the store, and has gone
        return "the master's pod ended first: nothing is left to wait for at the end; this pod ends too"
    return (
        f"not every pod reached the end within {EXIT_BARRIER_S:g} s (one was lost, drained or stopped "
        "earlier): this pod ends without waiting for it"
    )


def quiet_exit_barrier(record: logging.LogRecord) -> bool:
    """A logging filter: torch's exit-barrier traceback replaced by its one line (exit_barrier_line)."""
    if (line := exit_barrier_line(record)) is None:
        return True
    RankStopper._say(line)
    return False


EXIT_BARRIER_S = 10.0


def with_short_exit_barrier() -> None:
    """torchrun's agents made with an exit barrier of EXIT_BARRIER_S (torch offers no flag for it)."""
    from torch.distributed.launcher import api

    base = api.LocalElasticAgent

    class Agent(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs.setdefault("exit_barrier_timeout", EXIT_BARRIER_S)
            super().__init__(*args, **kwargs)

    api.LocalElasticAgent = Agent


#: torch's C++ log level, read once when torch loads (c10's TORCH_CPP_LOG_LEVEL): the agent's own warnings are a
#: store's socket closing at a planned end, each with a page of C++ frames; its ranks keep the user's level.
AGENT_CPP_LOG_LEVEL = "ERROR"
CPP_LOG_LEVEL_VAR = "TORCH_CPP_LOG_LEVEL"


@contextmanager
def agent_cpp_log_level() -> Iterator[None]:
    """AGENT_CPP_LOG_LEVEL while torch loads in this process (unless the user chose a level), then the
    environment as it was, which the ranks inherit."""
    chosen = os.environ.get(CPP_LOG_LEVEL_VAR)
    os.environ[CPP_LOG_LEVEL_VAR] = chosen or AGENT_CPP_LOG_LEVEL
    try:
        yield
    finally:
        if chosen is None:
            del os.environ[CPP_LOG_LEVEL_VAR]


def main(argv: Sequence[str] | None = None) -> int:
    with agent_cpp_log_level():
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    with_short_exit_barrier()
    args.signals_to_handle = without_stop_signals(args.signals_to_handle)
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(is_not_a_stop)
    logging.getLogger("torch.distributed.elastic.agent.server.api").addFilter(quiet_exit_barrier)
    # The ranks inherit this mask: a forward that comes before a rank has installed its handler (the
    # first seconds, while it imports torch) stays pending until stop.stop_on_signals() unblocks it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {FORWARDED_STOP})
    with RankStopper().running() as stopper:
        try:
            run(args)
        except ChildFailedError as exc:
            rank, first = exc.get_first_failure()
            status = stopper.exit_status or pod_exit_status(failure.exitcode for failure in exc.failures.values())
            if status == EXIT_STOPPED:
                print(
                    f"maskrcnn-dist torchrun: every rank stopped on request; exit {status}", file=sys.stderr, flush=True
                )
                os._exit(status)  # at once: the interpreter's teardown would add seconds the grace period counts
            print(
                f"maskrcnn-dist torchrun: {len(exc.failures)} worker(s) failed, first rank {rank} with exit code "
                f"{first.exitcode} (its error line is above); exit {status}",
                file=sys.stderr,
            )
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
