"""A pytest plugin that records what each test costs: wall seconds and CPU seconds, its own process's
and its children's, setup, call and teardown together.

CPU seconds are the figure that a shared machine leaves nearly alone: another engineer's work beside
the suite stretches a test's wall time, not the work its processes do. `--timings PATH` writes
one JSON record per test (id, outcome, markers, wall, cpu) when the session ends; tests/hack/
timings.py reports them per folder, and checks a run against the committed baseline
(tests/hack/timings-baseline.json: the budget check that `.ci/run` runs after `make test`).

Two halves, so that pytest-xdist's workers (`make test` runs `-n 2`) are measured where they run:
`Meter`, in the process that runs the test, puts each phase's seconds on its report (the report
is what a worker sends to the controller); `Timings`, in the controller (or the only process),
sums the phases of each test and writes the file.

What the CPU figure leaves out: a child process that nobody waits for (its time never reaches
RUSAGE_CHILDREN), and a module-scoped fixture's setup is charged to the first test that asks for it
(as pytest's own --durations does).

Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
from zygote import PID_VAR as ZYGOTE_PID_VAR


@dataclass
class Cost:
    """One test's record: its node id, outcome and marks, and its summed phases."""

    id: str
    outcome: str = "passed"
    markers: list[str] = field(default_factory=list)
    wall: float = 0.0
    cpu: float = 0.0
    load: float = 0.0  # the one-minute load average when the test started
    work: str = ""  # what made it slow: it trained or started a process (tests/tiers.py)


def _cpu_seconds() -> float:
    """User + system seconds of this process and of every child it has reaped (and theirs), and of the
    zygote's children (tests/zygote.py reaps the trainers it forks for this worker's tests)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _zygote_children_cpu()


def _zygote_children_cpu() -> float:
    pid = os.environ.get(ZYGOTE_PID_VAR)
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime


COST = "cost"  # the user property a phase's report carries: {"wall", "cpu", "load", "markers", "work"}
PHASE_CPU = pytest.StashKey[float]()


class Meter:
    """Where a test runs: each phase's wall (pytest's own duration) and CPU seconds on its report."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        return (yield from self._phase(item))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        return (yield from self._phase(item))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Iterator[None]:
        return (yield from self._phase(item))

    @staticmethod
    def _phase(item: pytest.Item) -> Iterator[None]:
        started = _cpu_seconds()
        try:
            return (yield)
        finally:
            item.stash[PHASE_CPU] = _cpu_seconds() - started

    # Outermost, so that the tiers plugin's teardown note ("work") is on the item when this reads it.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
        report = yield
        cost = {"wall": report.duration, "cpu": item.stash.get(PHASE_CPU, 0.0)}
        if call.when == "setup":
            cost["load"] = os.getloadavg()[0]
            cost["markers"] = sorted({mark.name for mark in item.iter_markers()} - {"parametrize", "usefixtures"})
        if call.when == "teardown":
            cost["work"] = "; ".join(text for name, text in item.user_properties if name == "work")
        report.user_properties.append((COST, cost))
        return report


class Timings:
    """Sums every phase of every test (their reports, from this process or from xdist's workers) and
    writes the records to `path` at the session's end."""

    def __init__(self, path: Path, workers: int = 1) -> None:
        self.path = path
        self.workers = workers
        self.costs: dict[str, Cost] = {}
        self.started = time.time()
        self.load_at_start = list(os.getloadavg())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cost = self.costs.setdefault(report.nodeid, Cost(report.nodeid))
        if report.failed:
            cost.outcome = "failed"
        elif report.skipped and cost.outcome != "failed":
            cost.outcome = "skipped"
        for name, phase in report.user_properties:
            if name == COST:
                cost.wall += phase["wall"]
                cost.cpu += phase["cpu"]
                cost.load = phase.get("load", cost.load)
                cost.markers = phase.get("markers", cost.markers)
                cost.work = phase.get("work", cost.work)

    def pytest_sessionfinish(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "started": self.started,
            "wall": time.time() - self.started,
            "cpus": os.cpu_count(),
            "workers": self.workers,
            "load_at_start": self.load_at_start,
            "load_at_end": list(os.getloadavg()),
            "tests": [asdict(cost) for cost in self.costs.values()],
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=0) + "\n")
        tmp.replace(self.path)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--timings",
        metavar="PATH",
        help="write each test's wall and CPU seconds to PATH (JSON) when the session ends",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--timings"):
        return
    config.pluginmanager.register(Meter(), "timings_meter")  # in xdist's workers too
    if not hasattr(config, "workerinput"):
        workers = config.getoption("numprocesses", None) or 1  # pytest-xdist's -n
        config.pluginmanager.register(Timings(Path(config.getoption("--timings")), int(workers)), "timings_recorder")
