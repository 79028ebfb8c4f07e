"""Three real `launch` processes (master, worker 1, worker 2) bring the pipeline trainer up on loopback."""

from __future__ import annotations

import json
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


def run_pipeline(tmp_path: Path, name: str, **flags: object) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`maskrcnn-launch local` over SMALL_RUN with `flags` instead of its own (underscores or dashes); returns
    the run and its metrics records."""
    out = tmp_path / name
    argv = [
        sys.executable,
        "-m",
        "maskrcnn_launcher",
        "local",
        "--wait-timeout",
        "60",
        "--grace",
        "30",
        "--",
        *to_argv({**SMALL_FLAGS, **{k.replace("_", "-"): v for k, v in flags.items()}}),
        "--output-dir",
        str(out),
        "--data-path",
        str(tmp_path / "data"),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), timeout=280)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launch_local_runs_the_pipeline_trainer(tmp_path: Path) -> None:
    result, records = run_pipeline(tmp_path, "run", lr=0.01)
    lines = result.stdout.splitlines()
    # Each pod started the trainer with its own rank, through the launcher.
    for name, rank in (("master", 0), ("worker1", 1), ("worker2", 2)):
        assert any(line.startswith(f"[{name}]") and f"(rank {rank}/3) exec:" in line for line in lines), name
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert train[0]["link/worker1->worker2/bytes"] > 0  # features crossed from stage 1 to stage 2
    assert any(r["kind"] == "eval" for r in records)
    assert (tmp_path / "run" / "checkpoints" / "checkpoint_00000002.pt").is_file()
    assert any(line.startswith("[worker2]") and "master finished" in line for line in lines)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pipeline_amp_composes_with_bf16_transport(tmp_path: Path) -> None:
    """bf16 autocast in every stage plus bf16 features on the wire: the first step's loss stays within
    2% of fp32 (the tolerance test_amp.py states for the local engine), training still runs."""

    def losses(records: list[dict]) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}

    fp32 = losses(run_pipeline(tmp_path, "fp32", lr=0.005)[1])
    amp = losses(run_pipeline(tmp_path, "amp", lr=0.005, amp=True, bf16_transport=True)[1])
    assert sorted(amp) == [1, 2]
    assert amp[1] == pytest.approx(fp32[1], rel=0.02)


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
