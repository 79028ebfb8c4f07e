"""Which scenarios run when: up to `jobs` at once, the longest first, and what a stop does to them.

The scheduler knows a scenario only by its name and its `Job` (a started scenario: whether it is done,
its result, terminate, kill), so tests drive it with fake jobs and a fake clock; runner.py makes the
real ones (one process each). Invariants: never more than `jobs` running; a job's failure is its own
(the others run on); after a stop nothing new starts, every running job is terminated and waited for
(killed after `grace` seconds), and every name gets a result, returned in the order the names came.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .scenarios import Result

log = logging.getLogger("e2e")


class Job(Protocol):
    """A started scenario."""

    def done(self) -> bool: ...

    def result(self) -> Result: ...  # once done() is true

    def terminate(self) -> None: ...  # SIGTERM: the scenario unwinds and removes its containers

    def kill(self) -> None: ...  # SIGKILL, after the grace: what it made may be left behind


def longest_first(names: Sequence[str], seconds: Mapping[str, float]) -> list[str]:
    """`names` by measured seconds, longest first, so that the last to finish are short ones. A name
    without a figure counts as the longest (a new scenario's length is unknown); ties keep their order."""
    return sorted(names, key=lambda n: -seconds.get(n, math.inf))


@dataclass
class Scheduler:
    """Runs scenarios as `launch(name)` jobs, `jobs` at a time; `stop` is its signal handler."""

    launch: Callable[[str], Job]
    jobs: int = 1
    grace: float = 45.0  # `make e2e`'s timeout sends SIGKILL 60 s after SIGTERM
    poll: float = 0.2
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    stopped_by: str | None = None
    _started: dict[str, float] = field(default_factory=dict)

    def stop(self, signum: int, frame: object = None) -> None:  # noqa: ARG002
        """No scenario starts after this; the loop terminates the running ones (a second signal changes
        nothing: the first one's wind-down goes on)."""
        if self.stopped_by is None:
            self.stopped_by = signal.Signals(signum).name
            log.error("harness: %s: stopping every running scenario (their containers are removed)", self.stopped_by)

    def run(self, names: Sequence[str], order: Sequence[str] | None = None) -> list[Result]:
        """Run every name, in `order` (default: as given); the results in the order of `names`."""
        pending, running, results = list(order or names), {}, {}
        while (pending or running) and self.stopped_by is None:
            self._collect(running, results)
            while pending and len(running) < self.jobs and self.stopped_by is None:
                self._start(pending.pop(0), running, results)
            if running:
                self.sleep(self.poll)
        if self.stopped_by is not None:
            self._wind_down(running, results)
            for name in pending:
                results[name] = Result(name, False, 0.0, detail=f"not run: the harness got {self.stopped_by}")
        return [results[n] for n in names]

    def _start(self, name: str, running: dict[str, Job], results: dict[str, Result]) -> None:
        self._started[name] = self.clock()
        try:
            running[name] = self.launch(name)
        except Exception as exc:  # e.g. no process could be made: this scenario fails, the others run
            results[name] = Result(name, False, 0.0, detail=f"could not start: {exc!r}")
            return
        log.info("harness: started %s (%d running: %s)", name, len(running), ", ".join(running))

    def _collect(self, running: dict[str, Job], results: dict[str, Result]) -> None:
        for name, job in list(running.items()):
            if job.done():
                results[name] = job.result()
                del running[name]

    def _wind_down(self, running: dict[str, Job], results: dict[str, Result]) -> None:
        """Terminate every running job, wait up to `grace` for them to clean up, kill the rest."""
        for job in running.values():
            job.terminate()
        deadline = self.clock() + self.grace
        while running and self.clock() < deadline:
            self._collect(running, results)
            if running:
                self.sleep(self.poll)
        self._collect(running, results)
        for name, job in running.items():
            job.kill()
            seconds = self.clock() - self._started[name]
            detail = f"killed: still running {self.grace:.0f}s after {self.stopped_by} (leftovers: python -m e2e clean)"
            results[name] = Result(name, False, seconds, detail=detail)
            log.error("harness: %s %s", name, detail)
