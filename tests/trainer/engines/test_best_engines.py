"""Early stopping and best.pt in the multi-process engines: every process stops at the same evaluation.

The metric is bbox_APl, COCO's AP of large objects (more than 96x96 pixels): the images here are at most
64 pixels, so it is 0 at every evaluation. The first evaluation is then the best, each later one a tie
(no new best), and --patience 1 must end training at the second evaluation on every process, whatever
the model learnt: a process that went on alone would wait in its next collective until the timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from maskrcnn_launcher import contract

from maskrcnn_dist.checkpoint import load_checkpoint
from maskrcnn_dist.config import small_cpu_run, to_argv
from maskrcnn_dist.data import write_train_val
from maskrcnn_dist.training.metrics import read_metrics

from ..procs import run_job, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

# 4 training images: two steps per epoch (ddp: 2 ranks x 1 image; pipeline: a batch of 2); 3 epochs planned.
STOPPING = to_argv(small_cpu_run(64, threads=1, workers=0, warmup_iters=2, print_freq=1, rpc_timeout=60))
STOPPING += ["--epochs", "3", "--eval-every-epoch", "--best-metric", "bbox_APl", "--patience", "1"]


@pytest.fixture(scope="module")
def small_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small_images")
    write_train_val(root, num_train=4, num_val=2, seed=7, image_size=(48, 64), max_objects=2)
    return root


def assert_stopped_at_the_second_evaluation(out: Path, log: str) -> None:
    records = read_metrics(out / "metrics.jsonl")
    assert max(r["step"] for r in records if r["kind"] == "train") == 4, log[-3000:]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4]
    assert [(r["step"], r["metric"]) for r in records if r["kind"] == "best"] == [(2, "bbox_APl")]
    assert load_checkpoint(out / "checkpoints")["step"] == 4  # the final checkpoint
    assert load_checkpoint(out / "checkpoints" / "best.pt")["step"] == 2
    assert log.count("early stop: bbox_APl has not improved for 1 evaluations") == 1, log[-3000:]  # main only


def test_ddp_ranks_stop_together(small_images: Path, tmp_path: Path, free_port: int):
    out = tmp_path / "run"
    args = [*STOPPING, "--engine", "ddp", "--batch-size", "1", "--data-path", str(small_images)]
    result = run_job(torchrun(2, free_port, [*args, "--output-dir", str(out)]), timeout=360)
    assert result.returncode == 0, result.stdout[-3000:]
    assert_stopped_at_the_second_evaluation(out, result.stdout)


def test_the_pipeline_stops_and_its_workers_finish(small_images: Path, tmp_path: Path):
    out = tmp_path / "run"
    args = [*STOPPING, "--batch-size", "2", "--micro-batches", "2", "--data-path", str(small_images)]
    argv = [sys.executable, "-m", "maskrcnn_launcher", "local", "--wait-timeout", "60", "--grace", "30", "--"]
    env = {k: v for k, v in os.environ.items() if k not in contract.READ_VARS and k not in contract.EXPORTED_VARS}
    result = subprocess.run(
        [*argv, *args, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        env={**env, "HOSTNAME": "test-host"},
        timeout=360,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_stopped_at_the_second_evaluation(out, result.stdout + result.stderr)
    assert "master finished" in result.stdout + result.stderr  # the stage workers were released
