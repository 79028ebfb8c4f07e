"""The pipeline engine through `maskrcnn-launch local` (master, worker1, worker2 as real launch processes
on loopback), stopped by a signal: SIGTERM to the runner, which passes it on once to every pod, or to
one stage worker alone, which passes it to the master over RPC. Either way the master finishes the step,
gathers and writes the checkpoint and ends the session; every process exits 75.

The uninterrupted run the resume is held against (`reference`) is also the one check that the launcher
brings the pipeline trainer up and that it trains, evaluates and checkpoints (each run of this file starts
three pods; one run serves every test that only reads it). The run whose stage worker is told alone trains
with bf16 autocast and bf16 features on the wire, its first step held against the reference's.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from maskrcnn_launcher.contract import TERMINATION_GRACE_SECONDS

from maskrcnn_dist.checkpoint import latest_checkpoint, load_checkpoint
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.torchrun import trainer_pid
from maskrcnn_dist.training.metrics import read_metrics

from ...conftest import MODEL_HEADS
from ...disk import drop_checkpoints
from ...stop_procs import (
    Job,
    assert_stop_step,
    assert_stopped_cleanly,
    small_args,
    stop_after,
    train_losses,
)
from .pipeline_toy import small_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 8
# One micro-batch: the shortest run that is the same bit for bit from one run to the next (so is any M:
# each stage adds its micro-batches' gradients in its schedule's order, whatever order the calls arrive in).
MICRO_BATCHES = 1


def local_job(data: Path, out: Path, logs: Path, *extra: str) -> Job:
    # The model's own heads: the amp run's first step is held within 2% of this fp32 reference's.
    args = small_args(data, out, batch_size=2, micro_batches=MICRO_BATCHES, rpc_timeout=60, **MODEL_HEADS)
    runner = [sys.executable, "-m", "maskrcnn_launcher", "local", "--wait-timeout", "120", "--grace", "60", "--"]
    return Job([*runner, *args, *extra], logs, {TERMINATION_GRACE_SECONDS: ""})


def finished(job: Job) -> Job:
    try:
        assert job.start().finish(300) == 0, job.output
    finally:
        job.kill()
    return job


@pytest.fixture(scope="module")
def reference_job(stop_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    """One epoch of STEPS steps, not stopped: its output in `reference`, the runner's lines in its stdout."""
    out = tmp_path_factory.mktemp("pipeline_reference") / "run"
    job = finished(local_job(stop_coco, out, out.parent / "logs"))
    yield job
    drop_checkpoints(out)


@pytest.fixture(scope="module")
def reference(reference_job: Job) -> Path:
    return reference_job.log_dir.parent / "run"


def test_launch_local_runs_the_pipeline_trainer(reference_job: Job, reference: Path) -> None:
    """Every pod started the trainer with its own rank through the launcher; the master trained every step
    (features crossing from stage 1 to stage 2), evaluated at the epoch's end and wrote a checkpoint with
    torchvision's key names; the workers left when the master finished."""
    lines = reference_job.stdout.splitlines()
    for name, rank in (("master", 0), ("worker1", 1), ("worker2", 2)):
        assert any(line.startswith(f"[{name}]") and f"(rank {rank}/3) exec:" in line for line in lines), name
    assert any(line.startswith("[worker2]") and "master finished" in line for line in lines), reference_job.output
    records = read_metrics(reference / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    assert train[-1]["loss"] < train[0]["loss"], [r["loss"] for r in train]
    assert train[0]["link/worker1->worker2/bytes"] > 0
    assert [r for r in records if r["kind"] == "eval"], "evaluation through the pipeline wrote no record"
    state = load_checkpoint(latest_checkpoint(reference / "checkpoints"))
    assert state["engine"] == "pipeline" and state["step"] == STEPS
    model = state["model"]  # torchvision's key names: it loads into a plain model of the same build
    num_classes = model["roi_heads.box_predictor.cls_score.bias"].numel()
    build_model(small_config().model, num_classes=num_classes).load_state_dict(model)


def test_sigterm_to_the_runner_stops_every_pod_and_the_resume_trains_the_rest(stop_coco, reference, tmp_path) -> None:
    out = tmp_path / "run"
    job = local_job(stop_coco, out, tmp_path / "stopped")
    code = stop_after(job, out, "train", 3, lambda j: j.signal(signal.SIGTERM))
    closing = assert_stopped_cleanly(job, code, lines=3)  # master, worker1, worker2
    step = assert_stop_step(out, 3)
    assert all(f"checkpoint of step {step}" in m["saved"] for m in closing), job.output
    assert job.stdout.count("[local] SIGTERM: passed on to every pod") == 1
    assert "every pod stopped on request" in job.stdout

    resumed = finished(local_job(stop_coco, out, tmp_path / "resumed", "--resume", "auto"))
    assert "dropped" not in resumed.stdout  # no step after the checkpoint was recorded: none is trained twice
    got, expected = train_losses(out / "metrics.jsonl"), train_losses(reference / "metrics.jsonl")
    assert [s for s, _ in got] == list(range(1, STEPS + 1))  # every planned step once
    for (step_got, terms), (_, reference_terms) in zip(got, expected, strict=True):
        for name, value in reference_terms.items():  # the pipeline equivalence tests' tolerance
            assert terms[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (step_got, name)
    print(f"pipeline: stopped at step {step} (signalled after 3), {job.seconds_to_exit:.2f}s from SIGTERM to exit")


def test_a_stage_worker_told_alone_passes_the_stop_to_the_master(stop_coco, reference, tmp_path) -> None:
    """This run also trains with bf16 autocast in every stage and bf16 features on the wire (what stops a
    pipeline does not depend on it): its first step's loss stays within 2% of fp32's (the tolerance
    test_amp.py states for the local engine), and training goes on."""
    out = tmp_path / "run"
    job = local_job(stop_coco, out, tmp_path / "logs", "--amp", "--bf16-transport")
    code = stop_after(job, out, "train", 3, lambda j: j.signal(signal.SIGTERM, pid=trainer_pid(j.proc.pid, 2)))
    closing = assert_stopped_cleanly(job, code, lines=3)
    assert sorted(m["reason"] for m in closing) == ["SIGTERM", "SIGTERM on worker2", "the master's stop"]
    assert_stop_step(out, 3, latest=2)  # the request reaches the master while its step runs, or just after
    assert "[local] SIGTERM" not in job.stdout  # the runner itself was not asked
    amp, fp32 = train_losses(out / "metrics.jsonl"), train_losses(reference / "metrics.jsonl")
    assert [step for step, _ in amp][:3] == [1, 2, 3]
    assert sum(amp[0][1].values()) == pytest.approx(sum(fp32[0][1].values()), rel=0.02)


def test_a_stage_worker_told_during_evaluation_stops_every_pod_there_without_an_ap_record(stop_coco, tmp_path) -> None:
    """Worker 2 alone is asked once the epoch end's evaluation has begun (its validation record is written):
    the master learns it over RPC between two evaluation batches and stops there, with no AP record."""
    out = tmp_path / "run"
    job = local_job(stop_coco, out, tmp_path / "logs", "--val-batch-size", "1")
    try:
        job.start().wait_for(out / "metrics.jsonl", "val", STEPS, timeout=300)
        job.signal(signal.SIGTERM, pid=trainer_pid(job.proc.pid, 2))
        code = job.finish(120)
    finally:
        job.kill()
    closing = assert_stopped_cleanly(job, code, lines=3)
    assert "SIGTERM on worker2 during evaluation" in [m["reason"] for m in closing], job.output
    assert [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"] == []
    state = load_checkpoint(out / "checkpoints")  # the newest
    assert (state["step"], state["pending_hooks"]) == (STEPS, ["evaluation"])
