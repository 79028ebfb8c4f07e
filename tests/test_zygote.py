"""tests/zygote.py and its proxy (tests/zygote_site/sitecustomize.py): a served program behaves as the
process its parent started, through tests/zygote_probe.py. What a served trainer does is every other
test's business; these hold what makes it the same process to its parent: argv, folder, environment,
threads, streams, signal mask, the signals it is sent, and the way it ends."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from zygote import SOCKET_VAR

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TESTS = Path(__file__).resolve().parent


def start(*words: str, env: dict[str, str] | None = None, script: bool = False, **popen: object) -> subprocess.Popen:
    """`python -u -m zygote_probe WORDS` (`script`: `python -u zygote_probe.py WORDS`) from the tests
    folder, with its first line read into `.probe`."""
    full_env = {**os.environ, "PROBE": "seen", "OMP_NUM_THREADS": "2", **(env or {})}
    program = ["zygote_probe.py"] if script else ["-m", "zygote_probe"]
    proc = subprocess.Popen(
        [sys.executable, "-u", *program, *words],
        cwd=TESTS,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    proc.probe = json.loads(proc.stdout.readline())  # type: ignore[attr-defined]
    return proc


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def gone(pid: int) -> bool:
    for _ in range(500):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("script", [False, True], ids=["module", "script"])
def test_a_served_program_has_its_argv_folder_environment_threads_and_exit_code(script: bool) -> None:
    for code in (3, 0):
        proc = start("exit", str(code), script=script)
        finish(proc)
        probe = proc.probe  # type: ignore[attr-defined]
        assert proc.returncode == code
        assert probe["pid"] != proc.pid  # forked by the zygote: the proxy stood in for it
        assert probe["argv"] == [str(TESTS / "zygote_probe.py") if not script else "zygote_probe.py", "exit", str(code)]
        assert (probe["cwd"], probe["probe_env"], probe["threads"]) == (str(TESTS), "seen", 2)
        assert probe["unbuffered"]


def test_only_the_trainers_and_the_suites_trainer_programs_are_served(tmp_path: Path) -> None:
    site = importlib.util.spec_from_file_location("zygote_site_under_test", TESTS / "zygote_site" / "sitecustomize.py")
    proxy = importlib.util.module_from_spec(site)
    site.loader.exec_module(proxy)  # in this process it serves nothing: pytest is not a served program
    python, bin_dir = sys.executable, os.path.dirname(sys.executable)
    served = {
        (python, "-m", "maskrcnn_dist.cli", "train"): "maskrcnn_dist.cli",
        (python, "-u", "-m", "maskrcnn_dist.cli"): "maskrcnn_dist.cli",
        (python, os.path.join(bin_dir, "maskrcnn-dist"), "eval"): os.path.join(bin_dir, "maskrcnn-dist"),
        (python, str(TESTS / "trainer" / "engines" / "pipeline" / "pipeline_procs.py"), "master"): "pipeline_procs",
    }
    for argv, what in served.items():
        found = proxy._served(list(argv))
        assert found is not None and what in (found["module"] or found["script"]), argv
    elsewhere = tmp_path / "pipeline_procs.py"  # a test's own file of the same name: not the suite's program
    for argv in (
        (python, "-m", "maskrcnn_dist.torchrun"),  # reads TORCH_CPP_LOG_LEVEL as torch loads
        (python, "-m", "maskrcnn_launcher", "local"),
        (python, "-c", "import maskrcnn_dist"),
        (python, "-X", "faulthandler", "-m", "maskrcnn_dist.cli"),
        (python, str(elsewhere), "master"),
        (python, str(tmp_path / "maskrcnn-dist")),
    ):
        assert proxy._served(list(argv)) is None, argv


def test_without_the_zygote_a_program_runs_as_itself() -> None:
    proc = start("exit", "0", env={SOCKET_VAR: ""})
    finish(proc)
    assert proc.probe["pid"] == proc.pid  # type: ignore[attr-defined]
    fds = start("exit", "0", pass_fds=(os.open(os.devnull, os.O_RDONLY),))  # a descriptor the child must get
    finish(fds)
    assert fds.probe["pid"] == fds.pid  # type: ignore[attr-defined]


@pytest.mark.real_processes
def test_a_test_marked_real_processes_starts_real_ones() -> None:
    assert not os.environ.get(SOCKET_VAR)
    proc = start("exit", "0")
    finish(proc)
    assert proc.probe["pid"] == proc.pid  # type: ignore[attr-defined]


def test_a_signal_to_the_proxy_reaches_the_program_and_its_exit_comes_back() -> None:
    proc = start("wait")
    assert proc.stdout.readline() == "waiting\n"
    proc.send_signal(signal.SIGTERM)
    _, err = finish(proc)
    assert proc.returncode == 75
    assert "probe: stopped by signal 15" in err


def test_a_program_killed_by_a_signal_kills_its_proxy_with_it() -> None:
    proc = start("sleep")
    assert proc.stdout.readline() == "sleeping\n"
    proc.send_signal(signal.SIGTERM)
    finish(proc)
    assert proc.returncode == -signal.SIGTERM


def test_a_killed_proxy_takes_its_program_with_it() -> None:
    proc = start("sleep")
    proc.kill()
    finish(proc)
    assert gone(proc.probe["pid"])  # type: ignore[attr-defined]


def test_an_uncaught_exception_exits_1_with_its_traceback_and_an_interrupt_by_sigint() -> None:
    proc = start("raise")
    _, err = finish(proc)
    assert proc.returncode == 1
    assert "RuntimeError: the probe raised" in err
    interrupted = start("interrupt")
    finish(interrupted)
    assert interrupted.returncode == -signal.SIGINT


def block_sigusr1_ignore_sigusr2() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def test_the_program_inherits_the_signal_mask_and_the_ignored_signals() -> None:
    proc = start("exit", "0", preexec_fn=block_sigusr1_ignore_sigusr2)
    finish(proc)
    assert proc.probe["pid"] != proc.pid  # type: ignore[attr-defined]
    assert signal.SIGUSR1 in proc.probe["blocked"]  # type: ignore[attr-defined]
    # and only that: the server forks with every signal blocked until the child takes its parent's mask
    assert signal.SIGTERM not in proc.probe["blocked"]  # type: ignore[attr-defined]
    assert proc.probe["sigusr2_ignored"]  # type: ignore[attr-defined]
