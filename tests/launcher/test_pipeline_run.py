"""A pipeline master started alone leaves within its join timeout. The three pods of `maskrcnn-launch local`
training the pipeline are tests/trainer/engines/pipeline/test_stop_pipeline.py's (one run there serves the
launch, training, evaluation, checkpoint, bf16 and stop tests)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from maskrcnn_dist.config import small_cpu_run, to_argv

from .conftest import clean_env

SMALL_FLAGS = small_cpu_run(
    64,
    synthetic_images=4,
    synthetic_image_size=64,
    max_steps=2,
    batch_size=2,
    micro_batches=2,
    workers=0,
    threads=1,
    print_freq=1,
    rpc_timeout=60,
)
SMALL_RUN = to_argv(SMALL_FLAGS)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_master_whose_workers_never_come_exits_within_the_join_timeout(tmp_path: Path, free_port: int) -> None:
    """Only the master is started: it must not wait torch's 30 minutes for the group to form."""
    argv = [
        sys.executable,
        "-m",
        "maskrcnn_launcher",
        "launch",
        "--role",
        "master",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port),
        "--",
        *SMALL_RUN,
        "--output-dir",
        str(tmp_path / "run"),
        "--data-path",
        str(tmp_path / "data"),
        "--join-timeout",
        "5",
    ]
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), timeout=500)
    assert result.returncode == 1
    assert "did not form within --join-timeout 5s" in result.stderr
    assert time.monotonic() - started < 300  # its 5 s and the start, not the default's 600 s
