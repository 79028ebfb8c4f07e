"""A pytest plugin that keeps the `slow` mark honest: a test that trains (an optimizer steps) or starts a
process, and is not marked `slow`, fails at its teardown naming what it did.

`make test-fast` (`-m 'not slow'`) is the quick loop only while every such test carries the mark; a
forgotten one used to cost that loop seconds to minutes each (issue 54: 65 of 2,090 tests were marked,
and the fast tier still trained). The mark is checked where the work happens, not guessed from the
source: an audit hook (`sys.addaudithook`) sees every program this process starts (subprocess,
posix_spawn, exec) and torch's global optimizer hook sees every optimizer step, so a fixture's work
counts for the test that first asked for it (module-scoped runs included).

A fixture that trains or starts one (a module's shared run, a started group) makes every test that asks
for it slow, wherever it lives: list it under `slow_fixtures` in pyproject.toml's pytest options and
each of its users gets the mark at collection (as the `helm` fixture's get `needs_helm`); the failure
names such a fixture.

Not counted: a plain fork (the data cache's writer, the data check's pool: no new interpreter, a few
milliseconds, its work done while this test waits and so in its time); helm and docker, which have
their own marks (`needs_helm`, `needs_docker`) and train nothing, and helm's fetch in a fresh clone
(get-helm.sh); the forking server of the console fixture and of the suite's trainers (tests/zygote.py,
once a worker), whose console children report their own steps and programs here (`note_child_work`);
a test marked `slow` or `soak`.

Loaded by tests/conftest.py (`pytest_plugins`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from checkout_guard import fail_teardown

# Tools with their own marks: starting them is not what `slow` is about.
# get-helm.sh: the `helm` fixture's fetch of the pinned helm when none is installed (a fresh clone),
# once a session, for whichever needs_helm test asks first.
OWN_MARK_TOOLS = {"helm", "docker", "get-helm.sh"}
# Started by an import, not by a test: ctypes.util.find_library runs `ldconfig -p` when torch (or another
# library) is first imported in a process, inside whichever test imports it first (an xdist worker's
# first file decides which); that test neither trains nor starts anything of its own.
IMPORT_TOOLS = {"ldconfig"}
# The forking server of the `console` fixture and of the trainers, started once a worker (its console
# children are reported to note_child_work, as they are not this process's).
ZYGOTE = "zygote.py"
TIER_MARKS = ("slow", "soak")


class WorkSeen:
    """What the running test has done that makes it slow: the first process it started, its steps."""

    def __init__(self) -> None:
        self.running = False
        self.process = ""
        self.steps = 0
        self.fixture = ""  # the fixture whose setup did the work first, if any
        self.hooked = False

    def hook_optimizers(self) -> None:
        """Once torch is loaded (by a test: the launcher's tests must run without it)."""
        if not self.hooked and "torch" in sys.modules:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            register_optimizer_step_pre_hook(self.step)
            self.hooked = True

    def reset(self) -> None:
        self.process, self.steps, self.fixture = "", 0, ""

    def busy(self) -> bool:
        return bool(self.steps or self.process)

    def audit(self, event: str, args: tuple) -> None:
        if not self.running or self.process:
            return
        if event == "subprocess.Popen":
            self.note_command(args[0], args[1])
        elif event in ("os.posix_spawn", "os.exec"):
            self.note_command(args[0], args[1])

    def note_command(self, executable: object, argv: object) -> None:
        words = [os.fsdecode(w) for w in argv] if isinstance(argv, (list, tuple)) else [os.fsdecode(argv)]
        program = os.fsdecode(executable) if executable else (words[0] if words else "")
        if Path(program).name in OWN_MARK_TOOLS | IMPORT_TOOLS or any(w.endswith(ZYGOTE) for w in words):
            return
        self.process = " ".join(" ".join(words).split())[:200]

    def step(self, *_: object) -> None:
        if self.running:
            self.steps += 1

    def work(self) -> str:
        did = []
        if self.steps:
            did.append(f"trained ({self.steps} optimizer step(s))")
        if self.process:
            did.append(f"started a process ({self.process})")
        return " and ".join(did)

    def describe(self) -> str:
        where = (
            f" in the setup of its fixture `{self.fixture}`: list that fixture under `slow_fixtures` (pyproject.toml)"
            if self.fixture
            else ": mark it `@pytest.mark.slow`"
        )
        return (
            f"this test {self.work()} but is not marked slow{where} "
            "(docs/testing.md: `make test-fast` runs what is not)"
        )


def note_child_work(steps: int, process: str) -> None:
    """What a child forked by tests/zygote.py did: counted for the running test as its own."""
    if _SEEN and _SEEN[0].running:
        _SEEN[0].steps += steps
        _SEEN[0].process = _SEEN[0].process or process


_SEEN: list[WorkSeen] = []  # one per process: an audit hook cannot be removed (pytester's inline runs)
SEEN_KEY = pytest.StashKey[WorkSeen]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "slow_fixtures",
        type="linelist",
        default=[],
        help="fixtures that train or start a process: every test that asks for one is marked slow",
    )
    parser.addoption(
        "--tiers",
        choices=("check", "report"),
        default="check",
        help="check: a test that trains or starts a process and is not marked slow fails (the default); "
        "report: only record it (tests/timings.py)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_fixtures = set(config.getini("slow_fixtures"))
    for item in items:
        if slow_fixtures.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> object:
    """Names the first fixture whose setup trained or started a process, for the failure's message."""
    seen = request.config.stash[SEEN_KEY]
    idle = not seen.busy()
    result = yield
    if seen.running and idle and seen.busy():
        seen.fixture = fixturedef.argname
    return result


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[SEEN_KEY].hook_optimizers()


def pytest_configure(config: pytest.Config) -> None:
    if not _SEEN:
        seen = WorkSeen()
        _SEEN.append(seen)
        sys.addaudithook(seen.audit)
    config.stash[SEEN_KEY] = _SEEN[0]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures: from here to its teardown, its work is watched (unless it is slow)."""
    seen = item.config.stash[SEEN_KEY]
    seen.reset()
    seen.hook_optimizers()
    seen.running = not any(item.get_closest_marker(mark) for mark in TIER_MARKS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    seen = item.config.stash[SEEN_KEY]
    if call.when != "teardown" or not seen.running:
        return report
    seen.running = False
    if seen.busy():
        fixture = f" (fixture {seen.fixture})" if seen.fixture else ""
        item.user_properties.append(("work", seen.work() + fixture))  # for the timings record (tests/timings.py)
        if item.config.getoption("--tiers") == "check":
            fail_teardown(report, "slow mark", seen.describe())
    return report
