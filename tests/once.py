"""A folder built once for the whole test session, whichever xdist worker asks for it first.

`make test` runs two xdist workers, each with its own session fixtures: a run that several test files
only read (a trained checkpoint) would otherwise be trained once per worker that runs one of them. Here
the first asker builds it under an exclusive lock in the folder the workers' temporary folders share
(pytest-xdist's recipe for session fixtures that run once); the other waits on the lock and reads what
was built. A build that fails leaves no mark, so the next asker builds again and fails in its own test.
In one process (no xdist) the folder is the session's own.

Whatever reads a shared folder must not write into it: another worker may be reading it at that moment.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

BUILT = ".built"  # written last: the folder is whole


def shared_root(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session sees: the parent of a worker's base temporary folder."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """shared_root/`name`, made by `build(folder)` (an empty folder it fills) unless a worker made it already."""
    root = shared_root(factory)
    folder = root / f"once-{name}"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while building: the other worker waits here
        if not (folder / BUILT).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / BUILT).touch()
    return folder


def remove_all(factory: pytest.TempPathFactory) -> None:
    """Every folder built once in this session (a run's checkpoints are tens of MB): for the process that
    ends after its workers (xdist's controller) or the one process."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        for folder in shared_root(factory).glob("once-*"):
            shutil.rmtree(folder, ignore_errors=True)
