"""Stopping real training processes in tests: start one, wait for a record, signal it, check what it left.

"After step k" is read from the run itself, not from a clock: `Job.wait_for` polls metrics.jsonl until
the record is there (the trainer writes it right after the step), then the test signals. The signal
then lands in step k+1 (or, rarely, between the record and the boundary check of step k): the stop's
checkpoint is of step k or k+1, which the tests allow and check against the records.

Every process a test starts, and every process under it (torchrun's ranks and the pods of
`maskrcnn-launch local` run in sessions of their own), is killed when the test ends, however it ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maskrcnn_launcher.contract import EXIT_STOPPED

from maskrcnn_dist.checkpoint import list_checkpoints, load_checkpoint
from maskrcnn_dist.config import small_stop_run, to_argv
from maskrcnn_dist.torchrun import descendant_pids
from maskrcnn_dist.training.metrics import read_metrics

from .conftest import TEST_HEADS
from .procs import REPO

# The trainer's closing line (stop.Stopped.closing_line): what stopped it, what it saved, how long it took.
CLOSING = re.compile(r"stopped by (?P<reason>.+?): (?P<saved>.+); (?P<seconds>[\d.]+)s from the request to exit")


def small_args(data: Path, out: Path, **flags: Any) -> list[str]:
    """The small model at 64 px on CPU, one epoch of `data`, every step logged, conftest.py's TEST_HEADS (RoIs and
    detections an image) unless `flags` say otherwise: what each stop test trains."""
    return to_argv(small_stop_run(data, out, **{**TEST_HEADS, **flags}))


@dataclass
class Job:
    """One started command: its process, its output files, and the moment the test signalled it."""

    argv: list[str]
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    signalled_at: float | None = None
    seconds_to_exit: float | None = None

    def start(self) -> Job:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **self.env}
        with open(self.log_dir / "stdout", "w") as out, open(self.log_dir / "stderr", "w") as err:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=err, env=env, cwd=REPO, start_new_session=True)
        return self

    @property
    def stdout(self) -> str:
        return (self.log_dir / "stdout").read_text()

    @property
    def stderr(self) -> str:
        return (self.log_dir / "stderr").read_text()

    def wait_for(self, metrics: Path, kind: str, step: int, timeout: float) -> None:
        """Until metrics.jsonl holds a `kind` record at `step` (the process must still be running)."""
        deadline = time.monotonic() + timeout
        while not any(r["kind"] == kind and r["step"] >= step for r in records(metrics)):
            assert self.proc is not None and self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {kind} record at step {step} in {timeout:g}s:\n{self.output}"
            time.sleep(0.02)

    def wait_for_line(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.proc is not None and self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output}"
            assert time.monotonic() < deadline, f"no line with {text!r} in {timeout:g}s:\n{self.output}"
            time.sleep(0.02)

    def signal(self, signum: int = signal.SIGTERM, pid: int | None = None, group: bool = False) -> None:
        """`signum` to this job's process (or `pid`), or to its whole process group, as dumb-init sends it."""
        assert self.proc is not None
        target = pid or self.proc.pid
        os.killpg(target, signum) if group else os.kill(target, signum)
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()

    def finish(self, timeout: float) -> int:
        """The exit code, within `timeout` seconds; the seconds from the first signal to the exit are kept."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout:g}s:\n{self.output}") from None
        if self.signalled_at is not None:
            self.seconds_to_exit = time.monotonic() - self.signalled_at
        return code

    @property
    def output(self) -> str:
        return (self.stdout + self.stderr)[-6000:]

    def kill(self) -> None:
        """SIGKILL this process and everything under it (in whatever session), children first found."""
        if self.proc is None or self.proc.poll() is not None:
            return
        tree = descendant_pids(self.proc.pid)
        for pid in [self.proc.pid, *tree]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


def stop_after(job: Job, out: Path, kind: str, step: int, send) -> int:
    """Start `job`, wait for its `kind` record at `step`, `send(job)`, and return its exit code."""
    try:
        job.start().wait_for(out / "metrics.jsonl", kind, step, timeout=300)
        send(job)
        return job.finish(120)
    finally:
        job.kill()


def records(metrics: Path) -> list[dict[str, Any]]:
    return read_metrics(metrics) if metrics.is_file() else []


def train_losses(metrics: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, loss terms) of every train record, in file order."""
    train = [r for r in records(metrics) if r["kind"] == "train"]
    return [(r["step"], {k: v for k, v in r.items() if k.startswith("loss")}) for r in train]


def assert_stopped_cleanly(job: Job, code: int, lines: int = 1) -> list[re.Match]:
    """Exit 75, no traceback, and `lines` closing lines (one per process): their matches."""
    assert code == EXIT_STOPPED, f"exit {code}:\n{job.output}"
    assert "Traceback" not in job.stderr and "Traceback" not in job.stdout, job.output
    closing = [m for line in (job.stdout + job.stderr).splitlines() if (m := CLOSING.search(line))]
    assert len(closing) == lines, job.output
    return closing


def newest_checkpoint(run: Path) -> dict[str, Any]:
    found = list_checkpoints(run / "checkpoints")
    assert found, f"no checkpoint in {run}"
    return load_checkpoint(found[-1])


def assert_stop_step(run: Path, signalled_after: int, latest: int = 1) -> int:
    """The stop's checkpoint is of step k, or a later one by at most `latest` (the signal landed in the step
    after k, or later still in ddp: after that step's all-reduce), and is the run's last train record."""
    step = int(newest_checkpoint(run)["step"])
    assert signalled_after <= step <= signalled_after + latest, (signalled_after, step)
    assert [s for s, _ in train_losses(run / "metrics.jsonl")][-1] == step
    return step
