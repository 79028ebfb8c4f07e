"""Everything the tests and the build read lives in the checkout: a user's clone has nothing beside it.

Two guards. checkout_guard.py (loaded by tests/conftest.py) watches this process at run time: a test
that opens, lists, globs or hands a command a path beside the repository fails. These tests prove it
does, on a throw-away checkout whose tests read a sibling folder, run by a pytest of their own. And a
static check reads the test, build and e2e sources for paths that leave the checkout (`ROOT.parent`,
`parents[N]` above the root, `"../shared"`, a script's `$(dirname "$0")/..` climbing past the root),
which covers what the audit hook cannot see: a bare stat, and a child process's own reads.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUARD = ROOT / "tests" / "checkout_guard.py"
SIBLING = "shared/schema.yaml"

# A test file of the throw-away checkout: what it reads, and how.
READS = """
import os, subprocess, sys, tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_inside_the_checkout_and_system_paths():
    (REPO / "tests" / "conftest.py").read_text()
    os.listdir(REPO)
    open("/proc/self/status").read()
    os.listdir(sys.prefix)
    with tempfile.TemporaryFile() as f:
        f.write(b"x")
    subprocess.run([sys.executable, "-c", "pass"], cwd=REPO, check=True)


def test_a_hidden_sibling_is_a_cache_or_configuration():
    (REPO.parent / ".cache" / "x").read_text()


def test_reads_a_sibling_file():
    (REPO.parent / "shared" / "schema.yaml").read_text()


def test_reads_it_by_a_relative_path():
    assert os.getcwd() == str(REPO)
    open("../shared/schema.yaml").read()


def test_lists_the_parent_folder():
    os.listdir(REPO / "..")


def test_globs_a_sibling_folder():
    list((REPO.parent / "shared").glob("*.yaml"))


def test_hands_a_command_a_sibling_path():
    subprocess.run(["cat", "../shared/schema.yaml"], cwd=REPO, check=True, capture_output=True)


def test_hands_it_as_a_flag_value():
    subprocess.run(["true", "--values=" + str(REPO.parent / "shared" / "schema.yaml")], check=True)


def test_follows_a_link_out_of_the_checkout():
    (REPO / "tests" / "link.yaml").read_text()
"""
# Test name -> None (the guard passes it) or the path, under the checkout's parent, its error names.
EXPECTED = {
    "test_inside_the_checkout_and_system_paths": None,
    "test_a_hidden_sibling_is_a_cache_or_configuration": None,
    "test_reads_a_sibling_file": SIBLING,
    "test_reads_it_by_a_relative_path": SIBLING,
    "test_lists_the_parent_folder": "",
    "test_globs_a_sibling_folder": "shared",
    "test_hands_a_command_a_sibling_path": SIBLING,
    "test_hands_it_as_a_flag_value": SIBLING,
    "test_follows_a_link_out_of_the_checkout": SIBLING,
}
# Read while the module is imported, before any test runs: the session fails.
AT_COLLECTION = """
from pathlib import Path

SCHEMA = (Path(__file__).resolve().parents[2] / "shared" / "schema.yaml").read_text()


def test_nothing_wrong_here():
    assert SCHEMA
"""


def make_checkout(tmp_path: Path, tests: dict[str, str]) -> Path:
    """tmp_path/repo: a checkout with the guard and `tests`; tmp_path/shared (and .cache) beside it."""
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    for folder in ("shared", ".cache"):
        (tmp_path / folder).mkdir()
    (tmp_path / SIBLING).write_text("kind: CustomResourceDefinition\n")
    (tmp_path / ".cache" / "x").write_text("cached\n")
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    shutil.copy(GUARD, repo / "tests" / GUARD.name)
    (repo / "tests" / "conftest.py").write_text('pytest_plugins = ("checkout_guard",)\n')
    (repo / "tests" / "link.yaml").symlink_to(tmp_path / SIBLING)
    for name, text in tests.items():
        (repo / "tests" / name).write_text(text)
    return repo


def run_pytest(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", *args]
    return subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300)


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test name -> (passed | error | failure, the error's text) from a JUnit XML report."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        problems = [(child.tag, child.text or "") for child in case if child.tag in ("error", "failure")]
        found[case.get("name")] = problems[0] if problems else ("passed", "")
    return found


@pytest.mark.slow
def test_the_guard_fails_each_test_that_touches_the_checkouts_surroundings(tmp_path: Path) -> None:
    repo = make_checkout(tmp_path, {"test_reads.py": READS})
    proc = run_pytest(repo, "--junitxml", str(repo / "junit.xml"), "tests/test_reads.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = outcomes(repo / "junit.xml")
    expected = {name: "passed" if path is None else "error" for name, path in EXPECTED.items()}
    assert {name: outcome for name, (outcome, _) in found.items()} == expected, proc.stdout
    for name, path in EXPECTED.items():
        if path is not None:
            text, target = found[name][1], tmp_path / path
            listed = [line for line in text.splitlines() if line.startswith("  ")]
            named = [line for line in listed if line.startswith(f"  {target} (") or line.endswith(f"link to {target})")]
            assert "outside the checkout" in text and named, (name, text)


@pytest.mark.slow
def test_the_guard_fails_the_session_for_a_read_outside_any_test(tmp_path: Path) -> None:
    repo = make_checkout(tmp_path, {"test_at_collection.py": AT_COLLECTION})
    proc = run_pytest(repo, "tests/test_at_collection.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout, proc.stdout
    assert "checkout guard" in proc.stdout and f"  {tmp_path / SIBLING} (open)" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------------------------
# The static check: sources that name paths outside the checkout
# ---------------------------------------------------------------------------------------------

# What the tests, the build and the e2e harness are made of; not this file, whose examples of paths
# outside the checkout are the checks' own test data.
SCANNED = ("tests/**/*.py", "Makefile", "mk/*", ".ci/*", "helm/hack/*", "docs/hack/*", "e2e/**/*.py", "e2e/**/*.sh")
# Path(__file__)[.resolve()|.absolute()] then .parents[N] or .parent.parent...: where it climbs to.
FILE_PARENTS = re.compile(r"Path\(__file__\)(?:\.resolve\(\)|\.absolute\(\))?\.(?:parents\[(\d+)\]|((?:parent\.?)+))")
ROOT_PARENT = re.compile(r"\b(?:ROOT|REPO|REPO_ROOT|root)\.parents?\b|os\.pardir")
PY_UP = re.compile(r"""(["'])\.\.(?:/|\1)""")  # a string that starts with ../ or is ".."
SCRIPT_DIR_UP = re.compile(r"""\$\(dirname [^)]*\)((?:/\.\.)+)""")  # $(dirname "$0")/../..
SHELL_UP = re.compile(r"""(?:^|[\s"'=:(/])\.\.(?:/|$|[\s"')])""")


def escapes(relative: str, text: str) -> list[str]:
    """The lines of a source file (`relative` to the root) that name a path outside the checkout."""
    depth = len(Path(relative).parts) - 1  # folders between the file and the root
    python = relative.endswith(".py")
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        bad = bool(ROOT_PARENT.search(line))
        for match in FILE_PARENTS.finditer(line):
            # parents[N], like N + 1 times .parent, is the folder N levels above the file's own.
            level = int(match[1]) if match[1] is not None else match[2].count("parent") - 1
            bad |= level > depth
        if python:
            bad |= bool(PY_UP.search(line))
        else:
            for match in SCRIPT_DIR_UP.finditer(line):
                bad |= match[1].count("..") > depth
            bad |= bool(SHELL_UP.search(SCRIPT_DIR_UP.sub("", line)))
        if bad:
            found.append(f"{relative}:{number}: {line.strip()}")
    return found


@pytest.mark.parametrize(
    ("relative", "line"),
    [
        ("tests/chart/conftest.py", 'CRD = ROOT.parent / "shared" / "schemas"'),
        ("tests/chart/conftest.py", "ROOT = Path(__file__).resolve().parents[3]"),
        ("tests/chart/conftest.py", "ROOT = Path(__file__).parent.parent.parent.parent"),
        ("tests/test_x.py", 'SCHEMAS = Path("../shared/schemas")'),
        ("tests/test_x.py", "os.path.join(os.pardir, 'shared')"),
        ("e2e/kube.py", "ROOT = Path(__file__).resolve().parents[2]"),
        ("helm/hack/get-helm.sh", 'root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"'),
        ("mk/deploy.mk", "SCHEMAS ?= ../shared/schemas"),
        ("Makefile", "\tcp $(CURDIR)/../shared/x.yaml ."),
        (".ci/run", 'cd "$(dirname "$0")/.." && ls ../shared'),
    ],
)
def test_the_static_check_finds_a_path_that_leaves_the_checkout(relative: str, line: str) -> None:
    assert escapes(relative, line), f"{relative}: {line!r} was not flagged"


@pytest.mark.parametrize(
    ("relative", "line"),
    [
        ("tests/chart/conftest.py", "ROOT = Path(__file__).resolve().parents[2]"),
        ("tests/test_layering.py", "ROOT = Path(__file__).resolve().parents[1]"),
        ("tests/chart/conftest.py", "HERE = Path(__file__).parent.parent"),
        ("tests/chart/test_x.py", '"extraVolumeMounts[0].mountPath=/tmp/../data"'),
        ("tests/chart/test_x.py", 'f"PYTHONPATH={Path(maskrcnn_launcher.__file__).parents[1]}"'),
        ("helm/hack/get-helm.sh", 'root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"'),
        (".ci/run", 'cd "$(dirname "$0")/.."'),
    ],
)
def test_the_static_check_passes_paths_inside_the_checkout(relative: str, line: str) -> None:
    assert not escapes(relative, line)


def test_no_test_or_build_source_names_a_path_outside_the_checkout() -> None:
    files = sorted({p for pattern in SCANNED for p in ROOT.glob(pattern) if p.is_file()} - {Path(__file__).resolve()})
    assert any(p.name == "conftest.py" for p in files) and (ROOT / "Makefile") in files
    found = [hit for p in files for hit in escapes(str(p.relative_to(ROOT)), p.read_text(errors="replace"))]
    assert not found, "paths outside the checkout (a user's clone has nothing beside it):\n" + "\n".join(found)


def test_no_link_in_the_checkout_leads_outside_it() -> None:
    skipped = {".git", ".venv", ".tools", "runs", "wheelhouse", ".pytest_cache", ".ruff_cache"}
    outside = []
    for folder in ROOT.iterdir():
        if folder.name in skipped:
            continue
        for path in [folder, *folder.rglob("*")] if folder.is_dir() else [folder]:
            if path.is_symlink() and not path.resolve().is_relative_to(ROOT):
                outside.append(f"{path.relative_to(ROOT)} -> {path.resolve()}")
    assert not outside, outside
