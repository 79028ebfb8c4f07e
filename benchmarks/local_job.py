"""A `maskrcnn-launch local` job of the real trainer, as the elastic tests and benchmarks start it: the pods
of a topology on loopback, the master's train records read as they come, a launch rank's trainer killed,
and the whole job killed on the way out, however it ends.

Tests import it as `benchmarks.local_job` (the repository root is on their path), a benchmark as a sibling
(`import local_job`, its folder first on sys.path), as they do `common`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from maskrcnn_dist.torchrun import descendant_pids, trainer_pid
from maskrcnn_dist.training.metrics import read_metrics

Records = list[dict[str, Any]]
#: A master and two workers, one CPU rank each, on loopback (JSON is YAML).
THREE_CPU_PODS = json.dumps({"engine": "ddp", "workers": [{"devices": 0}] * 2, "network": {"interface": "lo"}})


class LocalJob:
    """`maskrcnn-launch local --topology <topology> <local_args> -- <trainer_args>` in a session of its own,
    writing its run to `out` and its output to a log in `work`."""

    def __init__(
        self, work: Path, out: Path, topology: str, trainer_args: Sequence[str], local_args: Sequence[str] = ()
    ) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.out, self.log = out, work / f"local-{time.monotonic_ns()}.log"
        (work / "topology.yaml").write_text(topology)
        argv = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(work / "topology.yaml")]
        argv += ["--wait-timeout", "120", "--grace", "30", *local_args, "--", *trainer_args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        with self.log.open("w") as sink:
            self.proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def records(self) -> Records:
        """The train records so far (read while the master appends: a torn last line is skipped)."""
        path = self.out / "metrics.jsonl"
        return [r for r in read_metrics(path) if r["kind"] == "train"] if path.exists() else []

    def wait_for(self, done: Callable[[Records], bool], timeout: float = 240) -> Records:
        """The train records once `done(records)`; AssertionError (with the job's output) if the job ends
        or `timeout` seconds pass first."""
        deadline = time.monotonic() + timeout
        while not done(records := self.records()):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()[-4000:]
            time.sleep(0.05)
        return records

    def wait_for_step(self, step: int, timeout: float = 240) -> Records:
        return self.wait_for(lambda records: any(r["step"] >= step for r in records), timeout)

    def wait_for_world(self, size: int, timeout: float = 240) -> Records:
        """Until the newest train record was trained by `size` members (every replacement admitted)."""
        return self.wait_for(lambda records: bool(records) and records[-1]["world_size"] == size, timeout)

    def trainer_pid(self, rank: int) -> int:
        """The trainer process of launch rank `rank` (not its pod's torchrun)."""
        return trainer_pid(self.proc.pid, rank)

    def kill_trainer(self, rank: int) -> float:
        """SIGKILL to launch rank `rank`'s trainer; the wall time of the kill."""
        pid = self.trainer_pid(rank)
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        return killed

    def finish(self, timeout: float = 300) -> int:
        """The job's exit status; whatever is left of it is killed on the way out."""
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the runner and every process under it (the pods run in sessions of their own)."""
        if self.proc.poll() is None:
            for pid in [self.proc.pid, *descendant_pids(self.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()

    def output(self) -> str:
        return self.log.read_text()
