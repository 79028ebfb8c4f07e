"""The `slow` mark is checked, not trusted (tests/tiers.py): on a throw-away project run by a pytest of
its own, a test that trains or starts a process without the mark fails naming what it did (or the
fixture that did it), a marked one passes, and a fixture listed under `slow_fixtures` marks each of
its users so that `-m 'not slow'` leaves them out."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

PROJECT_TESTS = """
import subprocess, sys

import pytest
import torch


def one_step():
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    (weight * 2).sum().backward()
    optimizer.step()


@pytest.fixture(scope="module")
def trained_once():
    one_step()
    return "run"


@pytest.fixture(scope="module")
def started_group():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return "group"


def test_quiet():
    assert torch.ones(1).sum() == 1
    import ctypes.util  # a first import's `ldconfig -p` (torch's, in whichever test imports it first)

    ctypes.util.find_library("c")


def test_trains_unmarked():
    one_step()


def test_starts_a_process_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.slow
def test_trains_marked():
    one_step()


def test_reads_an_unlisted_fixture_first(trained_once):
    assert trained_once == "run"


def test_reads_a_listed_fixture(started_group):
    assert started_group == "group"
"""


PROJECT_INI = """[pytest]
pythonpath = tests
markers =
    slow: trains or starts a process
    soak: a long run
slow_fixtures =
    started_group
"""


def run_project(tmp_path: Path, *args: str, plugins: tuple[str, ...] = ("tiers",)) -> subprocess.CompletedProcess:
    """This suite's plugins (`plugins`) over PROJECT_TESTS, in a pytest of its own with `args`."""
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("tiers.py", "checkout_guard.py", "timings.py", "zygote.py"):
        shutil.copy(TESTS / name, tests / name)
    (tests / "conftest.py").write_text(f"pytest_plugins = {plugins!r}\n")
    (tests / "test_project.py").write_text(PROJECT_TESTS)
    (tmp_path / "pytest.ini").write_text(PROJECT_INI)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_unmarked_work_fails_with_what_it_did_and_marked_work_passes(tmp_path: Path) -> None:
    result = run_project(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out
    assert "PASSED tests/test_project.py::test_quiet" in out
    assert "PASSED tests/test_project.py::test_trains_marked" in out
    assert "PASSED tests/test_project.py::test_reads_a_listed_fixture" in out  # marked by the fixture
    assert "this test trained (1 optimizer step(s)) but is not marked slow: mark it" in out
    assert "this test started a process (" in out and "-c pass) but is not marked slow" in out
    assert "in the setup of its fixture `trained_once`: list that fixture under `slow_fixtures`" in out
    assert out.count("ERROR tests/test_project.py::") + out.count("FAILED tests/test_project.py::") == 3, out


@pytest.mark.slow
def test_the_fast_tier_leaves_out_every_user_of_a_listed_fixture(tmp_path: Path) -> None:
    result = run_project(tmp_path, "-m", "not slow", "-k", "quiet or a_listed")
    assert result.returncode == 0, result.stdout
    assert "PASSED tests/test_project.py::test_quiet" in result.stdout
    assert "1 passed, 5 deselected" in result.stdout, result.stdout
