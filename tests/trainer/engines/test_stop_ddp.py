"""Two ddp ranks under `python -m maskrcnn_dist.torchrun`, stopped by a signal however it reaches them:
to torchrun alone (it forwards the stop once to each rank), to every process at once (a rank gets it
twice, and stops once), to one rank only (the other stops at the same step through the loss all-reduce,
or the evaluation's agreement rounds), twice (the ranks end at once)."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from maskrcnn_launcher.contract import TERMINATION_GRACE_SECONDS
from maskrcnn_launcher.peers import free_port as pick_free_port

from maskrcnn_dist.torchrun import trainer_pid

from ..disk import drop_checkpoints
from ..procs import torchrun
from ..stop_procs import (
    Job,
    assert_stop_step,
    assert_stopped_cleanly,
    newest_checkpoint,
    records,
    small_args,
    stop_after,
    train_losses,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 8  # 16 images, one per rank per step, one epoch; validation and evaluation at its end
ENV = {TERMINATION_GRACE_SECONDS: ""}


def ddp_job(data: Path, out: Path, port: int, logs: Path, *extra: str) -> Job:
    args = small_args(data, out, engine="ddp", batch_size=1, rpc_timeout=60)
    return Job(torchrun(2, port, [*args, *extra]), logs, ENV)


def stop_lines(job: Job) -> dict[str, int]:
    """How many times each rank took the stop ("stopping at step" lines, one per rank when it stops once)."""
    found = re.findall(r"\[rank (\d)\] INFO maskrcnn_dist.training.loop: .*: stopping at step", job.stderr + job.stdout)
    return {rank: found.count(rank) for rank in sorted(set(found))}


def sigterm_rank_1(job: Job) -> None:
    job.signal(signal.SIGTERM, pid=trainer_pid(job.proc.pid, 1))


@pytest.fixture(scope="module")
def reference(stop_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("ddp_reference") / "run"
    job = ddp_job(stop_coco, out, pick_free_port(), out.parent / "logs").start()
    try:
        assert job.finish(300) == 0, job.output
    finally:
        job.kill()
    yield out
    drop_checkpoints(out)


def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_the_resume_is_exact(
    stop_coco, reference, tmp_path, free_port
) -> None:
    """Stopped through torchrun mid-epoch, then resumed: the resume trains every step left as the
    uninterrupted run did, and is itself stopped by a signal to rank 1 alone while both evaluate at the
    epoch's end (their shards hold 2 images each at --val-batch-size 1): the agreement after each batch
    stops rank 0 too, instead of leaving it in the results' gather for ever. (One run for both: a stop
    during evaluation needs a run that trained to the epoch's end, which the resume is.)"""
    out = tmp_path / "run"
    job = ddp_job(stop_coco, out, free_port, tmp_path / "stopped")
    code = stop_after(job, out, "train", 3, lambda j: j.signal(signal.SIGTERM))
    closing = assert_stopped_cleanly(job, code, lines=2)
    step = assert_stop_step(out, 3, latest=2)
    path = out / "checkpoints" / f"checkpoint_{step:08d}.pt"
    assert {m["saved"] for m in closing} == {f"checkpoint of step {step}: {path}"}  # rank 0 wrote it, both know
    assert all(m["reason"].startswith("SIGUSR1") for m in closing)  # torchrun's forward, once to each rank
    assert stop_lines(job) == {"0": 1, "1": 1}
    assert "every rank stopped on request; exit 75" in job.stderr

    resumed = ddp_job(stop_coco, out, free_port, tmp_path / "resumed", "--resume", "auto", "--val-batch-size", "1")
    closing = assert_stopped_cleanly(resumed, stop_after(resumed, out, "val", STEPS, sigterm_rank_1), lines=2)
    assert all(m["reason"].endswith("during evaluation") for m in closing), resumed.output
    assert [r for r in records(out / "metrics.jsonl") if r["kind"] == "eval"] == []
    state = newest_checkpoint(out)
    assert (state["step"], state["pending_hooks"]) == (STEPS, ["evaluation"])
    assert "dropped" not in resumed.stderr  # no step after the checkpoint was recorded: none is trained twice
    assert train_losses(out / "metrics.jsonl") == train_losses(reference / "metrics.jsonl")  # bit for bit
    assert [s for s, _ in train_losses(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    print(f"ddp: stopped at step {step} (signalled after 3), {job.seconds_to_exit:.2f}s from SIGTERM to exit")


def test_a_signal_to_every_process_stops_each_rank_once(stop_coco, tmp_path, free_port) -> None:
    """What a signal to a group that held the ranks too would do: each rank gets SIGTERM itself and
    torchrun's forward. The forward is never a second signal."""

    def everyone(job: Job) -> None:
        ranks = [trainer_pid(job.proc.pid, rank) for rank in (0, 1)]
        job.signal(signal.SIGTERM, group=True)  # torchrun's process group, as dumb-init signals it
        for pid in ranks:
            job.signal(signal.SIGTERM, pid=pid)

    out = tmp_path / "run"
    job = ddp_job(stop_coco, out, free_port, tmp_path / "logs")
    assert_stopped_cleanly(job, stop_after(job, out, "train", 3, everyone), lines=2)
    assert_stop_step(out, 3, latest=2)
    assert stop_lines(job) == {"0": 1, "1": 1}
    assert "second SIGTERM" not in job.stderr


def test_a_signal_to_one_rank_stops_both_at_the_same_step(stop_coco, tmp_path, free_port) -> None:
    out = tmp_path / "run"
    job = ddp_job(stop_coco, out, free_port, tmp_path / "logs")
    code = stop_after(job, out, "train", 3, sigterm_rank_1)
    closing = assert_stopped_cleanly(job, code, lines=2)
    assert sorted(m["reason"] for m in closing) == ["SIGTERM", "a stop on another rank"]
    assert_stop_step(out, 3, latest=2)
    assert stop_lines(job) == {"0": 1, "1": 1}


def test_a_second_sigterm_to_torchrun_ends_the_ranks_at_once(stop_coco, tmp_path, free_port) -> None:
    def twice(job: Job) -> None:
        job.signal(signal.SIGTERM)
        job.wait_for_line("stops after its step in progress", timeout=10)  # forwarded: the stop is under way
        job.signal(signal.SIGTERM)

    out = tmp_path / "run"
    job = ddp_job(stop_coco, out, free_port, tmp_path / "logs")
    code = stop_after(job, out, "train", 2, twice)
    assert code == 128 + signal.SIGTERM, job.output
    assert job.seconds_to_exit is not None and job.seconds_to_exit < 10, job.seconds_to_exit
    assert "second SIGTERM: killing the ranks now" in job.stderr and "Traceback" not in job.stderr


def test_sigterm_while_the_ranks_start_up_stops_them_before_the_first_step(stop_coco, tmp_path, free_port) -> None:
    """The forward reaches ranks that are still importing torch: it waits for their handler (the
    wrapper's signal mask), and they stop once their group has formed, with nothing to save."""
    out = tmp_path / "run"
    job = ddp_job(stop_coco, out, free_port, tmp_path / "logs").start()
    try:
        while not started(job.proc.pid, ranks=2):
            assert job.proc.poll() is None, job.output
            time.sleep(0.01)
        job.signal(signal.SIGTERM)
        code = job.finish(300)
    finally:
        job.kill()
    closing = assert_stopped_cleanly(job, code, lines=2)
    assert all("nothing to save" in m["saved"] for m in closing), job.output
    assert records(out / "metrics.jsonl") == []


def started(root: int, ranks: int) -> bool:
    """Whether torchrun `root` has started every rank's process."""
    try:
        return all(trainer_pid(root, rank) for rank in range(ranks))
    except LookupError:
        return False
