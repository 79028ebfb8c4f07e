"""The error boundary every entry point runs in (maskrcnn_launcher.boundary): exit codes and one line."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner
from maskrcnn_launcher.boundary import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    EXIT_UNREACHABLE,
    EXIT_USER_ERROR,
    Failure,
    GuardedGroup,
)
from maskrcnn_launcher.errors import PeerTimeout, TopologyError


class Mine(Exception):
    """A package's own user error, known to its classifier."""


def _group() -> click.Group:
    @click.group(cls=GuardedGroup, classify=lambda e: Failure.of(7, f"mine: {e}") if isinstance(e, Mine) else None)
    def app() -> None:
        pass

    failures = {
        "runtime": RuntimeError("boom\nsecond line of a long torch message"),
        "mine": Mine("a bad field"),
        "topology": TopologyError(["workers[0].devices: -1", "stages: missing"]),
        "unreachable": PeerTimeout("master m:1 did not answer"),
        "os-user": FileNotFoundError(2, "No such file or directory", "/data/x.json"),
        "os-machine": OSError(28, "No space left on device"),
        "interrupt": KeyboardInterrupt(),
    }

    @app.command()
    @click.argument("kind")
    def fail(kind: str) -> None:
        raise failures[kind]

    @app.command()
    def ok() -> None:
        click.echo("fine")

    return app


@pytest.mark.parametrize(
    ("kind", "code", "lines"),
    [
        ("runtime", EXIT_RUNTIME, ["error: RuntimeError: boom second line of a long torch message (--debug or"]),
        ("mine", 7, ["error: mine: a bad field"]),
        ("topology", EXIT_USER_ERROR, ["error: workers[0].devices: -1", "error: stages: missing"]),
        ("unreachable", EXIT_UNREACHABLE, ["error: master m:1 did not answer"]),
        ("os-user", EXIT_USER_ERROR, ["error: /data/x.json: No such file or directory"]),
        ("os-machine", EXIT_RUNTIME, ["error: OSError: [Errno 28] No space left on device"]),
        ("interrupt", EXIT_INTERRUPTED, ["error: interrupted"]),
    ],
)
def test_each_failure_leaves_with_its_code_and_lines(kind: str, code: int, lines: list[str]):
    result = CliRunner().invoke(_group(), ["fail", kind])
    assert result.exit_code == code, result.output
    got = [line for line in result.stderr.splitlines() if line]  # click prints a newline on Ctrl-C
    assert len(got) == len(lines) and all(g.startswith(want) for g, want in zip(got, lines)), got
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("argv", [["--debug", "fail", "runtime"], ["fail", "--debug", "runtime"]])
def test_debug_anywhere_prints_the_traceback(argv: list[str]):
    result = CliRunner().invoke(_group(), argv)
    assert result.exit_code == EXIT_RUNTIME
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1] == "error: RuntimeError: boom second line of a long torch message"


def test_the_debug_variable_prints_the_traceback():
    result = CliRunner().invoke(_group(), ["fail", "mine"], env={"MASKRCNN_DEBUG": "1"})
    assert result.exit_code == 7 and "Traceback" in result.stderr


def test_usage_errors_are_one_line_and_success_is_zero():
    usage = CliRunner().invoke(_group(), ["fail"])
    assert usage.exit_code == EXIT_USER_ERROR
    assert usage.stderr.splitlines() == ["error: Missing argument 'KIND'. (see 'app fail --help')"]
    fine = CliRunner().invoke(_group(), ["ok"])
    assert fine.exit_code == 0 and fine.output == "fine\n"
    assert CliRunner().invoke(_group(), ["--help"]).exit_code == 0
