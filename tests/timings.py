"""A pytest plugin that records what each test costs: wall seconds and CPU seconds, its own process's
and its children's, setup, call and teardown together.

CPU seconds are the figure that a shared machine leaves nearly alone: another engineer's work beside
the suite stretches a test's wall time, not the work its processes do. `--timings PATH` writes
one JSON record per test (id, outcome, markers, wall, cpu) when the session ends; tests/hack/
timings.py reports them per folder, and checks a run against the committed baseline
(tests/hack/timings-baseline.json: the budget check that `.ci/run` runs after `make test`).

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
    """User + system seconds of this process and of every child it has reaped (and theirs)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Timings:
    """Times every phase of every test and writes the records to `path` at the session's end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.costs: dict[str, Cost] = {}
        self.started = time.time()
        self.load_at_start = list(os.getloadavg())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cost = self.costs.setdefault(item.nodeid, Cost(item.nodeid))
        cost.markers = sorted({mark.name for mark in item.iter_markers()} - {"parametrize", "usefixtures"})
        cost.load = os.getloadavg()[0]
        wall, cpu = time.perf_counter(), _cpu_seconds()
        yield
        cost.wall += time.perf_counter() - wall
        cost.cpu += _cpu_seconds() - cpu
        cost.work = "; ".join(text for name, text in item.user_properties if name == "work")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cost = self.costs.setdefault(report.nodeid, Cost(report.nodeid))
        if report.failed:
            cost.outcome = "failed"
        elif report.skipped and cost.outcome != "failed":
            cost.outcome = "skipped"

    def pytest_sessionfinish(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "started": self.started,
            "wall": time.time() - self.started,
            "cpus": os.cpu_count(),
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
    path = config.getoption("--timings")
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Timings(Path(path)), "timings_recorder")
