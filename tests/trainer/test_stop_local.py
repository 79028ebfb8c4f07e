"""The local engine stopped by a signal: a real `maskrcnn-dist train` process, signalled once a step's
record is written (stop_procs.py), then resumed with --resume auto and compared with an uninterrupted run."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from maskrcnn_launcher.contract import TERMINATION_GRACE_SECONDS

from maskrcnn_dist.checkpoint import list_checkpoints, load_checkpoint

from .disk import drop_checkpoints
from .stop_procs import (
    Job,
    assert_stop_step,
    assert_stopped_cleanly,
    newest_checkpoint,
    records,
    small_args,
    train_losses,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TRAIN = [sys.executable, "-m", "maskrcnn_dist.cli", "train"]
STEPS = 8  # 16 images, 2 per step, one epoch; validation and evaluation at its end
NO_GRACE = {TERMINATION_GRACE_SECONDS: ""}  # whatever the environment of the test run says


def run(job: Job, timeout: float = 300) -> Job:
    try:
        assert job.start().finish(timeout) == 0, job.output
    finally:
        job.kill()
    return job


@pytest.fixture(scope="module")
def reference(stop_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The uninterrupted run every stopped-and-resumed one must equal."""
    out = tmp_path_factory.mktemp("local_reference") / "run"
    job = run(Job([*TRAIN, *small_args(stop_coco, out, batch_size=2)], out.parent / "logs", NO_GRACE))
    assert "holds a stop" not in job.stderr and "terminationGracePeriodSeconds" not in job.stderr  # unset: no check
    yield out
    drop_checkpoints(out)


def test_sigterm_after_a_step_saves_it_and_the_resume_trains_the_rest_exactly(stop_coco, reference, tmp_path) -> None:
    """Stopped mid-epoch and resumed: the resume trains every step left as the uninterrupted run did. It
    is stopped in turn during the epoch end's evaluation, which it leaves pending, and a second resume
    runs that evaluation alone. (One chain for both: a stop during evaluation needs a run that trained to
    the epoch's end, which the first resume is.)"""
    out = tmp_path / "run"
    # DataLoader workers, and SIGTERM to the whole process group, as dumb-init (PID 1 in the image)
    # sends it: the workers must not die of it (they leave the group), the trainer stops.
    args = [*TRAIN, *small_args(stop_coco, out, batch_size=2, workers=2)]
    # A grace period no stop fits in: the run says so once, after its second step.
    job = Job(args, tmp_path / "stopped", {TERMINATION_GRACE_SECONDS: "0.01"}).start()
    try:
        job.wait_for(out / "metrics.jsonl", "train", 3, timeout=300)
        job.signal(signal.SIGTERM, group=True)
        code = job.finish(120)
    finally:
        job.kill()
    (closing,) = assert_stopped_cleanly(job, code)
    step = assert_stop_step(out, 3)
    assert closing["reason"] == "SIGTERM" and closing["saved"].startswith(f"checkpoint of step {step}: ")
    warnings = [line for line in job.stderr.splitlines() if "terminationGracePeriodSeconds" in line]
    assert len(warnings) == 1 and " WARNING " in warnings[0] and TERMINATION_GRACE_SECONDS in warnings[0]

    resumed = Job([*args, "--resume", "auto"], tmp_path / "resumed", {TERMINATION_GRACE_SECONDS: "3600"})
    try:
        resumed.start().wait_for(out / "metrics.jsonl", "val", STEPS, timeout=300)  # its evaluation runs now
        resumed.signal(signal.SIGTERM)
        code = resumed.finish(120)
    finally:
        resumed.kill()
    (closing,) = assert_stopped_cleanly(resumed, code)
    assert closing["reason"] == "SIGTERM during evaluation", resumed.output
    assert _final(out, "eval") == []  # no AP record from an evaluation that did not finish
    state = newest_checkpoint(out)
    assert (state["step"], state["pending_hooks"]) == (STEPS, ["evaluation"])
    assert "holds a stop" in resumed.stderr and "terminationGracePeriodSeconds" not in resumed.stderr
    assert "dropped" not in resumed.stderr  # no step after the checkpoint was recorded: none is trained twice
    # Every planned step once, each with the uninterrupted run's losses, bit for bit.
    assert train_losses(out / "metrics.jsonl") == train_losses(reference / "metrics.jsonl")
    assert [s for s, _ in train_losses(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    print(f"local: stopped at step {step} (signalled after 3), {job.seconds_to_exit:.2f}s from SIGTERM to exit")

    run(Job([*args, "--resume", "auto"], tmp_path / "evaluated", NO_GRACE))
    # The last resume evaluated the same model: one validation and one AP record, the reference's.
    assert _final(out, "val") == _final(reference, "val") and len(_final(out, "val")) == 1
    assert _final(out, "eval") == _final(reference, "eval") and len(_final(out, "eval")) == 1
    assert newest_checkpoint(out)["pending_hooks"] == []  # done: a later resume does not run it again


def _final(run_dir: Path, kind: str) -> list[dict]:
    found = [r for r in records(run_dir / "metrics.jsonl") if r["kind"] == kind]
    return [{k: v for k, v in r.items() if k != "time"} for r in found]


def test_a_second_signal_ends_the_run_at_once_and_leaves_no_half_checkpoint(stop_coco, tmp_path) -> None:
    out = tmp_path / "run"
    # A checkpoint every step: the second signal may land while one is being written.
    job = Job([*TRAIN, *small_args(stop_coco, out, batch_size=2, checkpoint_period=1)], tmp_path / "logs", NO_GRACE)
    try:
        job.start().wait_for(out / "metrics.jsonl", "train", 2, timeout=300)
        job.signal(signal.SIGTERM)
        time.sleep(0.1)
        assert job.proc is not None and job.proc.poll() is None, "the first signal only asks"
        job.signal(signal.SIGTERM)
        code = job.finish(30)
    finally:
        job.kill()
    assert code == -signal.SIGTERM, job.output  # ended by the signal: the shell's 143
    assert job.seconds_to_exit is not None and job.seconds_to_exit < 5, job.seconds_to_exit
    assert "second SIGTERM: exiting now" in job.stderr and "Traceback" not in job.stderr
    for path in list_checkpoints(out / "checkpoints"):  # whatever is there is whole
        assert load_checkpoint(path)["step"] <= 3


# real_processes: the local engine's trainer as a user starts it (torch imported in it, not forked from
# tests/zygote.py), signalled for real: one such trainer per engine in `make test`.
@pytest.mark.real_processes
def test_a_signal_before_the_first_step_ends_cleanly_with_nothing_to_save(stop_coco, tmp_path) -> None:
    out = tmp_path / "run"
    job = Job([*TRAIN, *small_args(stop_coco, out, batch_size=2)], tmp_path / "logs", NO_GRACE)
    try:
        job.start().wait_for_line("images checked", timeout=300)  # the data check runs
        job.signal(signal.SIGINT)  # Ctrl-C
        code = job.finish(120)
    finally:
        job.kill()
    (closing,) = assert_stopped_cleanly(job, code)
    assert closing["reason"].startswith("SIGINT") and "nothing to save" in closing["saved"], closing.string
    assert list_checkpoints(out / "checkpoints") == [] and records(out / "metrics.jsonl") == []
