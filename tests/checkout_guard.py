"""A pytest plugin that fails any test touching the checkout's surroundings (`../shared` and the like).

A user's clone has nothing beside it, so everything the tests read must live in the repository. An
audit hook (`sys.addaudithook`) sees every file this process opens, every folder it lists or globs,
every file it creates, moves or removes, and every command it starts (its arguments that are paths,
and its working folder). A path that resolves into the repository's parent folder but not into the
repository fails the test that touched it (an error at its teardown, naming the paths), or the
session when no test was running (collection, a session fixture's teardown).

Not the surroundings, although they may lie in that parent folder: the interpreter's prefixes and
site-packages (a venv beside the checkout), what was on sys.path when the session started, the
temporary folder, and hidden folders (a checkout in the home folder: ~/.cache, ~/.config). A checkout
placed directly in one of those (say /tmp/repo) has its siblings counted as theirs.

What an audit hook cannot see: a probe that only stats (`os.stat`, `Path.exists` raise no audit
event) and what a child process opens by itself beyond its arguments. For those,
tests/test_checkout_guard.py reads the sources for paths that leave the checkout.

Loaded by tests/conftest.py (`pytest_plugins`); the hook stays installed for the process's life (an
audit hook cannot be removed), and records nothing before `pytest_configure` makes the guard.
"""

from __future__ import annotations

import os
import site
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SESSION = "<no test running>"
# Audit event -> the positions of its arguments that are paths (CPython's audit events table).
PATH_EVENTS: dict[str, tuple[int, ...]] = {
    "open": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "os.chdir": (0,),
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.rename": (0, 1),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "glob.glob": (0,),
    "glob.glob/2": (0, 2),
    "shutil.copyfile": (0, 1),
    "shutil.copytree": (0, 1),
    "shutil.rmtree": (0,),
}
COMMAND_EVENTS = {"subprocess.Popen": (1, 2), "os.exec": (1, None), "os.posix_spawn": (1, None)}


# Where a checkout's parent is the file system's root: what the system itself reads.
SYSTEM_FOLDERS = ("/bin", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr", "/var")


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _strictly_within(path: str, folder: str) -> bool:
    return path != folder and _within(path, folder)


@dataclass
class CheckoutGuard:
    """Records the paths outside the checkout that the process touches, by the test running then."""

    root: str
    allowed: tuple[str, ...]
    current: str = SESSION
    touched: dict[str, dict[str, str]] = field(default_factory=dict)
    _outside: dict[str, str] = field(default_factory=dict)  # path seen -> its real path if outside, else ''
    _busy: threading.local = field(default_factory=threading.local)

    @classmethod
    def for_checkout(cls, root: Path) -> CheckoutGuard:
        parent = os.path.dirname(str(root))
        system = [sys.prefix, sys.base_prefix, sys.exec_prefix, tempfile.gettempdir(), *SYSTEM_FOLDERS]
        system += [*site.getsitepackages(), site.getusersitepackages()]
        # A system folder that holds the checkout's parent is not allowed wholesale (a checkout in
        # /tmp/work/repo still has /tmp/work/shared beside it); the parent itself may be one (a
        # checkout in /tmp/repo: its siblings are temporary files). A sys.path entry counts only when
        # it lies inside the parent or apart from it (not the parent itself: `cd ..; pytest repo`).
        allowed = {c for c in map(os.path.realpath, filter(None, system)) if not _strictly_within(parent, c)}
        allowed |= {c for c in map(os.path.realpath, filter(None, sys.path)) if not _within(parent, c)}
        return cls(str(root), tuple(sorted(allowed)))

    @property
    def parent(self) -> str:
        return os.path.dirname(self.root)

    def outside(self, path: str) -> bool:
        """Whether an absolute path lies in the checkout's surroundings."""
        if not _within(path, self.parent) or _within(path, self.root):
            return False
        first = path[len(self.parent) :].lstrip(os.sep).split(os.sep, 1)[0]
        return not first.startswith(".") and not any(_within(path, a) for a in self.allowed)

    def check(self, raw: object, event: str, cwd: str | None = None) -> None:
        if isinstance(raw, bytes):
            raw = os.fsdecode(raw)
        elif isinstance(raw, os.PathLike):
            raw = os.fspath(raw)
        if not isinstance(raw, str) or not raw:
            return
        absolute = os.path.abspath(os.path.join(cwd or os.getcwd(), raw))
        real = self._outside.get(absolute)
        if real is None:
            # Both spellings: `../shared` itself, and a link inside the checkout that leads there.
            real = os.path.realpath(absolute)
            real = real if self.outside(absolute) or self.outside(real) else ""
            self._outside[absolute] = real
        if real:
            what = event if real == absolute else f"{event}, a link to {real}"
            self.touched.setdefault(self.current, {}).setdefault(absolute, what)

    def audit(self, event: str, args: tuple) -> None:
        """The audit hook: cheap for the events it ignores, never re-entered by its own calls."""
        positions = PATH_EVENTS.get(event)
        if positions is None and event not in COMMAND_EVENTS:
            return
        if getattr(self._busy, "on", False):
            return
        self._busy.on = True
        try:
            if positions is not None:
                for i in positions:
                    if i < len(args):
                        self.check(args[i], event)
            else:
                self._check_command(event, args)
        finally:
            self._busy.on = False

    def _check_command(self, event: str, args: tuple) -> None:
        argv_at, cwd_at = COMMAND_EVENTS[event]
        cwd = args[cwd_at] if cwd_at is not None and cwd_at < len(args) else None
        if cwd is not None:
            self.check(cwd, f"{event} cwd")
        cwd = os.fsdecode(os.fspath(cwd)) if cwd is not None else None
        argv = args[argv_at] if argv_at < len(args) else ()
        for arg in _words(argv):
            # A path, or a path given as `--flag=PATH` / `NAME=PATH`.
            for word in {arg, arg.rpartition("=")[2]}:
                if os.sep in word:
                    self.check(word, f"{event} argument", cwd)

    def take(self, key: str) -> dict[str, str]:
        return self.touched.pop(key, {})


def _words(argv: object) -> Iterator[str]:
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    if not isinstance(argv, Iterable):
        return
    for item in argv:
        if isinstance(item, (bytes, os.PathLike)):
            item = os.fsdecode(os.fspath(item))
        if isinstance(item, str):
            yield from item.split()


def describe(touched: dict[str, str]) -> str:
    lines = [f"  {path} ({event})" for path, event in sorted(touched.items())]
    return "\n".join(
        [
            f"touched {len(touched)} path(s) outside the checkout {ROOT} (a user's clone has nothing beside it):",
            *lines,
            "move what the test needs into the repository (schemas/ for published API schemas)",
        ]
    )


# The one guard of this process, made by the first pytest_configure: an audit hook cannot be removed,
# so a second session in the same process (pytester's inline runs) reuses it rather than adding one.
_GUARD: list[CheckoutGuard] = []
GUARD_KEY = pytest.StashKey[CheckoutGuard]()
# What was touched while no test ran, for the terminal summary.
LEFT_KEY = pytest.StashKey[dict[str, str]]()


def pytest_configure(config: pytest.Config) -> None:
    if not _GUARD:
        guard = CheckoutGuard.for_checkout(ROOT)
        _GUARD.append(guard)
        sys.addaudithook(guard.audit)
    config.stash[GUARD_KEY] = _GUARD[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    guard = item.config.stash[GUARD_KEY]
    guard.current = item.nodeid
    try:
        return (yield)
    finally:
        guard.current = SESSION


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if call.when == "teardown":
        touched = item.config.stash[GUARD_KEY].take(item.nodeid)
        if touched:
            fail_teardown(report, "checkout guard", describe(touched))
    return report


def fail_teardown(report: pytest.TestReport, title: str, text: str) -> None:
    """Fail a test at its teardown with `text`; a test that failed already gets it as a section."""
    if report.failed:
        report.sections.append((title, text))
    else:
        report.outcome = "failed"
        report.longrepr = text


def pytest_sessionfinish(session: pytest.Session) -> None:
    guard = session.config.stash[GUARD_KEY]
    left = {path: event for key in list(guard.touched) for path, event in guard.take(key).items()}
    if left:
        session.config.stash[LEFT_KEY] = left
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    left = config.stash.get(LEFT_KEY, None)
    if left:
        terminalreporter.section("checkout guard", red=True)
        terminalreporter.write_line(f"outside any test (collection, session fixtures): {describe(left)}")
