"""One trainer per run folder (run_lock.py): a second one is refused in one line naming the holder, the
lock lasts the whole run, and a killed trainer's lock blocks nothing, whatever children it left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from maskrcnn_dist.config import small_cpu_run, to_argv
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.run_lock import LOCK_FILE, hold_run_folder
from maskrcnn_dist.training.loop import Trainer

from .conftest import fast_config

TINY = to_argv(small_cpu_run(64, max_steps=1, epochs=1, workers=0, warmup_iters=1, print_freq=1))

# A process that holds a folder's lock as a trainer does, says so, and (with FORK) leaves a child that
# outlives it, as a data-loader worker of a killed trainer may for a while.
HOLDER = textwrap.dedent(
    """
    import os, socket, sys, time
    from pathlib import Path
    if len(sys.argv) > 3:
        socket.gethostname = lambda: sys.argv[3]  # a holder on another machine
    from maskrcnn_dist.run_lock import hold_run_folder
    with hold_run_folder(Path(sys.argv[1]), "train"):
        if sys.argv[2] == "fork" and os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        print("held", flush=True)
        time.sleep(60)
    """
)


@contextmanager
def holder(folder: Path, fork: bool = False, host: str | None = None) -> Iterator[subprocess.Popen]:
    """A live process holding `folder`'s lock (killed, with its group, on the way out)."""
    argv = [sys.executable, "-c", HOLDER, str(folder), "fork" if fork else "-", *([host] if host else [])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        with_group = os.getpgid(proc.pid) if proc.poll() is None else None
        proc.kill()
        proc.wait(timeout=30)
        if with_group is not None:
            try:
                os.killpg(with_group, signal.SIGKILL)
            except ProcessLookupError:
                pass


def refusal(folder: Path) -> str:
    """The line that refuses a trainer `folder`'s lock ("" when it is free), asked from a process of its
    own (a POSIX lock never refuses its own process, and reading the file there would end it)."""
    probe = (
        "import sys; from pathlib import Path; from maskrcnn_dist.run_lock import hold_run_folder\n"
        "try:\n    with hold_run_folder(Path(sys.argv[1]), 'probe'): pass\n"
        "except Exception as exc:\n    print(exc); sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(folder)], capture_output=True, text=True, timeout=60)
    assert result.returncode in (0, 3), result.stderr
    return result.stdout.strip()


@pytest.mark.slow
def test_a_second_trainer_is_refused_in_one_line_naming_the_holder(console, tiny_coco: Path, tmp_path: Path):
    run = tmp_path / "run"
    with holder(run) as proc:
        result = console("maskrcnn-dist", "train", *TINY, "--data-path", str(tiny_coco), "--output-dir", str(run))
        result.assert_one_error_line(2, f"--output-dir {run} is in use", f"process {proc.pid} on host", "train")
        resumed = console(
            "maskrcnn-dist", "train", *TINY, "--data-path", str(tiny_coco), "--output-dir", str(run), "--resume", "auto"
        )
        resumed.assert_one_error_line(2, f"process {proc.pid}")
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]  # neither wrote a thing


@pytest.mark.slow
def test_the_trainer_holds_its_folder_from_start_to_end(tiny_coco: Path, tmp_path: Path, monkeypatch):
    from maskrcnn_dist.train import train

    seen = {}
    fit = Trainer.fit

    def fit_and_look(trainer: Trainer) -> None:
        seen["before"] = refusal(tmp_path / "run")
        fit(trainer)
        seen["after"] = refusal(tmp_path / "run")  # the last checkpoint and records written

    monkeypatch.setattr(Trainer, "fit", fit_and_look)
    train(fast_config(tiny_coco, tmp_path / "run", **{"max-steps": 1}))
    for when in ("before", "after"):
        assert f"process {os.getpid()} on host" in seen[when]
    assert refusal(tmp_path / "run") == ""


@pytest.mark.slow
@pytest.mark.parametrize("fork", [False, True], ids=["alone", "with-a-child-left"])
def test_a_killed_trainers_lock_blocks_no_resume(tmp_path: Path, fork: bool):
    run = tmp_path / "run"
    with holder(run, fork=fork) as proc:
        assert refusal(run)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # Its forked child lives on (a loader worker): it must not keep the dead trainer's folder. Taken
        # at once: held, it would be refused (no wait on one host), and a wait fails here.
        with hold_run_folder(run, "train", sleep=lambda _: pytest.fail("waited for a dead trainer's lock")):
            pass
        assert json.loads((run / LOCK_FILE).read_text())["pid"] == os.getpid()


@pytest.mark.slow
def test_a_resume_waits_a_while_for_a_holder_on_another_machine(tmp_path: Path):
    run = tmp_path / "run"
    naps: list[float] = []
    with holder(run, host="lost-node") as proc:
        with pytest.raises(ConfigError, match=f"process {proc.pid} on host lost-node"):
            with hold_run_folder(run, "train", wait_for_other_host_s=3, sleep=naps.append):
                pass
        assert naps  # it waited (a lost machine's lock ends when the file server expires it)
        naps.clear()
        with pytest.raises(ConfigError):
            with hold_run_folder(run, "train", sleep=naps.append):
                pass
        assert not naps  # a fresh run does not wait


def test_a_start_that_fails_in_a_folder_it_made_leaves_nothing(tmp_path: Path):
    run = tmp_path / "new" / "run"
    with pytest.raises(RuntimeError):
        with hold_run_folder(run, "train"):
            raise RuntimeError("the data could not be read")
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with hold_run_folder(tmp_path / "kept", "train"):
        (tmp_path / "kept" / "metrics.jsonl").write_text("")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [LOCK_FILE, "metrics.jsonl"]
