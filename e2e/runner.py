"""One scenario, run and reported: `run_scenario` (its verdict as a `Result`, whatever it raised) and
`ProcessJob` (it in a process of its own: the scheduler's job).

A job's process is forked (the harness's imports are shared, nothing is pickled but the result), says
its scenario's name on every log line, and sends its `Result` back over a pipe. In it, the first
SIGTERM or SIGINT raises `Terminated`, which unwinds through the scenario's `finally` blocks (its
containers and network are removed); later ones are ignored, so that `timeout`'s signal to the whole
process group and the harness's own cannot cut that cleanup short.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from .checks import Failed
from .cluster import DockerError, SpecError
from .scenarios import Result, Settings

log = logging.getLogger("e2e")

Scenario = Callable[[Settings], dict[str, Any]]


class Terminated(BaseException):
    """SIGTERM or SIGINT in a scenario's process: unwinds through every `finally`, so containers are removed."""


def run_scenario(name: str, scenario: Scenario, settings: Settings) -> Result:
    """Run one scenario; a failure (or a harness bug) becomes its failed `Result`, never an exception."""
    log.info("=== %s: %s", name, (scenario.__doc__ or "").split("\n")[0])
    started = time.monotonic()
    try:
        facts = scenario(settings)
        result = Result(name, True, time.monotonic() - started, facts=facts)
        log.info("=== %s: passed in %.0fs %s", name, result.seconds, json.dumps(facts))
    except (Failed, DockerError, SpecError) as exc:
        result = Result(name, False, time.monotonic() - started, detail=str(exc))
        log.error("=== %s: FAILED in %.0fs: %s (logs: %s)", name, result.seconds, exc, settings.out / name)
    except Exception as exc:  # a harness bug: still run the others, still report
        result = Result(name, False, time.monotonic() - started, detail=traceback.format_exc())
        log.error("=== %s: ERROR %s", name, exc)
    return result


def scenario_launcher(scenarios: Mapping[str, Scenario], settings: Settings) -> Callable[[str], ProcessJob]:
    """What the scheduler calls to start the scenario `name` in a process of its own."""
    return lambda name: ProcessJob(name, lambda: run_scenario(name, scenarios[name], settings))


class ProcessJob:
    """A scenario in a forked process; its `Result` comes back over a pipe."""

    def __init__(self, name: str, target: Callable[[], Result]) -> None:
        context = multiprocessing.get_context("fork")
        self.name = name
        self.started = time.monotonic()
        self._result: Result | None = None
        self._receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=_child, args=(name, target, send), name=f"e2e {name}")
        self.process.start()
        send.close()  # the child holds the only write end: its exit without a result reads as EOF here

    def done(self) -> bool:
        if self._result is None and self._receive.poll():
            try:
                self._result = self._receive.recv()
            except EOFError:  # it ended without a result (killed, or os._exit)
                self.process.join()
        if self._result is not None:
            self.process.join(timeout=30)
            return True
        return not self.process.is_alive()

    def result(self) -> Result:
        if self._result is not None:
            return self._result
        seconds = time.monotonic() - self.started
        return Result(self.name, False, seconds, detail=f"its process exited {self.process.exitcode} with no result")

    def terminate(self) -> None:
        if self.process.is_alive():
            self.process.terminate()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)


def _child(name: str, target: Callable[[], Result], send: Connection) -> None:
    """A job's process: the scenario under its own signal handlers and log prefix; its result sent back."""
    signals = (signal.SIGTERM, signal.SIGINT)

    def on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
        for s in signals:  # once: a second signal must not interrupt the cleanup the first one started
            signal.signal(s, signal.SIG_IGN)
        raise Terminated(signal.Signals(signum).name)

    for s in signals:
        signal.signal(s, on_signal)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(f"%(asctime)s e2e {name}: %(message)s", datefmt="%H:%M:%S"))
    started = time.monotonic()
    try:
        result = target()
    except Terminated as exc:
        result = Result(name, False, time.monotonic() - started, detail=f"interrupted ({exc}); its containers removed")
        log.error("=== %s: %s", name, result.detail)
    for s in signals:
        signal.signal(s, signal.SIG_IGN)
    send.send(result)
    send.close()
