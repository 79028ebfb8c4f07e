"""The elastic ddp group where it runs on GPUs (`ddp_elastic`): one single-rank pod per GPU (up to 3), each
a `maskrcnn_dist.torchrun` node of its own on this host pinned to its GPU by CUDA_VISIBLE_DEVICES, so the
group's backend is NCCL (one rank per device). The last pod's trainer is SIGKILLed after step 2; the
survivors must go on in place: the collective fails (NCCL: its watchdog aborts the communicator at
--rpc-timeout, TORCH_NCCL_ASYNC_ERROR_HANDLING=2), the next generation forms through the job's store,
every step is recorded once, the world size drops by one, and the job ends with exit 0 on every survivor.
On CPU the same three pods over gloo (the check's self-test)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common

from .harness import Env
from .runs import base_flags

KILL_AFTER = 2
RPC_TIMEOUT_S = 20  # how long NCCL's survivors wait on the dead peer before the watchdog aborts


def needs_elastic_devices(env: Env) -> str | None:
    if env.device == "cuda" and env.gpus < 2:
        return f"needs 2 GPUs: NCCL refuses two ranks on one device ({env.gpus} here)"
    return None


def check_ddp_elastic(env: Env) -> dict[str, Any]:
    from maskrcnn_launcher.peers import free_port

    from maskrcnn_dist.config import to_argv
    from maskrcnn_dist.torchrun import trainer_pid

    pods = min(env.gpus, 3) if env.device == "cuda" else 3
    out = Path(env.work) / "ddp_elastic"
    steps = max(env.profile.run_steps, KILL_AFTER + 4)
    flags = base_flags(env, env.data, out / "run", engine="ddp", elastic=True, max_steps=steps)
    flags |= {"rpc-timeout": RPC_TIMEOUT_S, "threads": 1 if env.device == "cpu" else None}
    argv = to_argv({k: v for k, v in flags.items() if v is not None})
    port = free_port()
    procs = [_start_pod(node, pods, port, argv, env, out / f"pod{node}.log") for node in range(pods)]
    try:
        _wait(lambda: _steps_done(out / "run") >= KILL_AFTER, procs, 600, "step 2")
        victim = trainer_pid(procs[-1].pid, pods - 1)  # the last pod's trainer, below its torchrun
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        codes = [proc.wait(timeout=600) for proc in procs[:-1]]
    finally:
        for proc in procs:
            common.end_group(proc)
    logs = "\n".join(p.read_text() for p in sorted(out.glob("pod*.log")))
    if any(codes):
        raise AssertionError(f"survivors exited {codes}; {_error_lines(logs)}")
    records = _train_records(out / "run")
    if [r["step"] for r in records] != list(range(1, steps + 1)):
        raise AssertionError(f"train records' steps {[r['step'] for r in records]}, expected 1..{steps}")
    sizes = [r["world_size"] for r in records]
    if sizes[0] != pods or sizes[-1] != pods - 1:
        raise AssertionError(f"world sizes {sizes}: expected {pods} then {pods - 1}")
    backends = sorted(set(re.findall(r"elastic ddp: member \d+, rank \d+ of \d+ \((\w+)\)", logs)))
    first_after = min(r["time"] for r in records if r["world_size"] == pods - 1)
    return {
        "pods": pods,
        "backend": backends,
        "kill_to_first_step_s": round(first_after - killed_at, 2),
        "world_sizes": sizes,
        "same_weights": bool(re.search(rf"elastic: the {pods - 1} replicas hold the same weights", logs)),
    }


def _start_pod(node: int, pods: int, port: int, argv: list[str], env: Env, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    torchrun = [sys.executable, "-m", "maskrcnn_dist.torchrun", "--nnodes", str(pods), "--node-rank", str(node)]
    torchrun += ["--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    variables = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if env.device == "cuda":
        variables["CUDA_VISIBLE_DEVICES"] = str(node)
    command = [*torchrun, "-m", "maskrcnn_dist.cli", "train", *argv]
    with open(log, "w") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=variables, start_new_session=True)


def _wait(done: Any, procs: list[subprocess.Popen], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise AssertionError(f"the job ended or timed out before {what}")
        time.sleep(0.1)


def _train_records(run: Path) -> list[dict[str, Any]]:
    """The train records so far (read while the master appends: a torn last line is skipped)."""
    from maskrcnn_dist.training.metrics import read_metrics

    path = run / "metrics.jsonl"
    return [r for r in read_metrics(path) if r["kind"] == "train"] if path.exists() else []


def _steps_done(run: Path) -> int:
    return max((r["step"] for r in _train_records(run)), default=0)


def _error_lines(logs: str) -> str:
    return "; ".join(line for line in logs.splitlines() if "error:" in line)[:500] or "no error line"
