"""What a preemption costs on each engine: SIGTERM to a real run, the seconds to exit, the step saved,
and what the resumed run trains again.

    .venv/bin/python benchmarks/bench_stop.py [--engines local,ddp,pipeline] [--after-step 3] [--images 16]

For each engine, one run of the small model on CPU (64 px, one epoch of a generated set) gets SIGTERM
where a pod would get it, once its train record of step `--after-step` is written:
  local     the trainer's process group (dumb-init, PID 1 in the image, signals its child's group);
  ddp       maskrcnn_dist.torchrun's process group, 2 ranks (what the launcher execs in a ddp pod);
  pipeline  one stage worker pod of `maskrcnn-launch local` (master + 2 workers on loopback): one pod
            told, its peers stop through the master.
The stopped run is then resumed with --resume auto to the end. Reported: seconds from SIGTERM to the
exit of everything started (the runner included), the exit code, the step of the stop's checkpoint, the
steps trained before the stop that the resume trains again (target 0), and whether metrics.jsonl ends
with exactly one train record per planned step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from maskrcnn_launcher.contract import TERMINATION_GRACE_SECONDS

from maskrcnn_dist.checkpoint import list_checkpoints, load_checkpoint
from maskrcnn_dist.config import small_stop_run, to_argv
from maskrcnn_dist.data import write_train_val
from maskrcnn_dist.torchrun import descendant_pids, trainer_pid
from maskrcnn_dist.training.metrics import read_metrics

ENGINES = ("local", "ddp", "pipeline")


def trainer_args(engine: str, data: Path, out: Path) -> list[str]:
    """The small CPU run of the stop tests: 2 images per step on every engine (ddp: 1 per rank)."""
    per_engine: dict[str, dict[str, Any]] = {
        "local": {"batch_size": 2},
        "ddp": {"engine": "ddp", "batch_size": 1},
        "pipeline": {"batch_size": 2, "micro_batches": 1},  # the engine comes from the launcher's topology
    }
    values = small_stop_run(data, out, rpc_timeout=60, **per_engine[engine])
    return to_argv(values)


def command(engine: str, args: list[str], port: int) -> list[str]:
    python = sys.executable
    if engine == "local":
        return [python, "-m", "maskrcnn_dist.cli", "train", *args]
    if engine == "ddp":
        rendezvous = ["--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        torchrun = [python, "-m", "maskrcnn_dist.torchrun", *rendezvous, "--master-port", str(port)]
        return [*torchrun, "-m", "maskrcnn_dist.cli", "train", *args]
    return [python, "-m", "maskrcnn_launcher", "local", "--wait-timeout", "120", "--grace", "60", "--", *args]


def train_steps(metrics: Path) -> list[int]:
    return [r["step"] for r in read_metrics(metrics) if r["kind"] == "train"] if metrics.is_file() else []


def pod_to_signal(engine: str, proc: subprocess.Popen) -> tuple[int, str]:
    """(process group, what it is) that gets SIGTERM: see the module's docstring."""
    if engine != "pipeline":
        return proc.pid, "the trainer's group" if engine == "local" else "torchrun's group"
    return trainer_pid(proc.pid, 2), "stage worker 2's group"  # the launcher exec'd the trainer in its pod


def start(argv: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", TERMINATION_GRACE_SECONDS: "60"}
    with open(log, "w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL whatever of a run is left (the ranks and pods run in sessions of their own)."""
    found = descendant_pids(proc.pid)
    for pid in [proc.pid, *found]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def measure(engine: str, data: Path, work: Path, after_step: int, port: int) -> dict[str, Any]:
    out = work / engine / "run"
    argv = command(engine, trainer_args(engine, data, out), port)
    out.parent.mkdir(parents=True)
    proc = start(argv, work / engine / "stopped.log")
    try:
        while max(train_steps(out / "metrics.jsonl"), default=0) < after_step:
            if proc.poll() is not None:
                raise RuntimeError(f"{engine}: exited {proc.returncode} before step {after_step}")
            time.sleep(0.02)
        pgid, target = pod_to_signal(engine, proc)
        signalled = time.monotonic()
        os.killpg(pgid, signal.SIGTERM)
        code = proc.wait(timeout=300)
        seconds = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    trained = max(train_steps(out / "metrics.jsonl"), default=0)  # the last step any rank finished
    checkpoints = list_checkpoints(out / "checkpoints")
    saved = int(load_checkpoint(checkpoints[-1])["step"]) if checkpoints else 0

    resumed = start([*argv, "--resume", "auto"], work / engine / "resumed.log")
    try:
        resumed_code = resumed.wait(timeout=600)
    finally:
        if resumed.poll() is None:
            kill_tree(resumed)
    steps = train_steps(out / "metrics.jsonl")
    planned = max(steps, default=0)
    return {
        "engine": engine,
        "signalled": target,
        "after_step": after_step,
        "seconds": seconds,
        "closing": closing_seconds((work / engine / "stopped.log").read_text()),
        "exit": code,
        "saved": saved,
        "redone": trained - saved,  # finished before the stop, not in its checkpoint: trained again
        "resumed_exit": resumed_code,
        "one_per_step": resumed_code == 0 and steps == list(range(1, planned + 1)),
        "planned": planned,
    }


def closing_seconds(log: str) -> str:
    """The longest "N s from the request to exit" of the processes' closing lines (stop.Stopped.closing_line)."""
    found = [float(s) for s in re.findall(r"; ([\d.]+)s from the request to exit", log)]
    return f"{max(found):.1f}" if found else "-"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--after-step", type=int, default=3)
    parser.add_argument("--images", type=int, default=16, help="training images (2 per step)")
    parser.add_argument("--keep", type=Path, help="a new folder to keep the runs and logs in")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_stop_") as tmp:
        work = opts.keep or Path(tmp)
        write_train_val(work / "data", num_train=opts.images, num_val=4, seed=3, image_size=(48, 64), max_objects=3)
        rows = [measure(e, work / "data", work, opts.after_step, free_port()) for e in opts.engines.split(",")]
    print(json.dumps(rows, indent=1))
    print("engine    SIGTERM to              after  SIGTERM->exit  closing line  exit  saved  redone  resumed  steps")
    for r in rows:
        print(
            f"{r['engine']:<9} {r['signalled']:<23} {r['after_step']:>5}  {r['seconds']:>12.2f}s  {r['closing']:>11}s  "
            f"{r['exit']:>4}  {r['saved']:>5}  {r['redone']:>6}  {r['resumed_exit']:>7}  {r['one_per_step']} "
            f"({r['planned']} steps)"
        )


if __name__ == "__main__":
    main()
