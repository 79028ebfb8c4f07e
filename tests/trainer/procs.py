"""Running real multi-process jobs in tests: bounded in time, and never leaving processes behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_job(
    args: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run `args` in its own process group; on timeout or any error the whole group is killed."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        print(output[-5000:])  # shown by pytest on failure
        raise
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(args, proc.returncode, output, None)


def torchrun_command(nproc: int, port: int, *program: str) -> list[str]:
    """torchrun (through maskrcnn_dist.torchrun, which keeps a rank's exit 2) with `nproc` ranks on
    this host, running `program` (a script and its arguments, or `--no-python` and a command)."""
    return [
        sys.executable,
        "-m",
        "maskrcnn_dist.torchrun",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        *program,
    ]


def torchrun(nproc: int, port: int, trainer_args: list[str]) -> list[str]:
    """`maskrcnn-dist train` under torchrun with `nproc` ranks."""
    return torchrun_command(nproc, port, "-m", "maskrcnn_dist.cli", "train", *trainer_args)
