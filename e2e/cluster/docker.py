"""The docker side of the emulated cluster: one bounded `docker` call, and a `Cluster` (a network and
the pod containers on it) that removes everything it made, whatever happened.

Every container and the network carry the label `maskrcnn-e2e` (containers.LABEL), so
`python -m e2e clean` finds leftovers of a harness that was itself killed.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .containers import LABEL, docker_run_args
from .pods import PodSpec

log = logging.getLogger("e2e")

DOCKER = os.environ.get("DOCKER", "docker")


class DockerError(Exception):
    pass


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One docker CLI call, bounded in time."""
    try:
        proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise DockerError(f"docker {' '.join(args[:3])} ...: no answer in {timeout:.0f}s") from exc
    if check and proc.returncode != 0:
        raise DockerError(f"docker {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


@dataclass
class ContainerState:
    status: str  # created, running, exited, ...
    exit_code: int
    started_at: str
    finished_at: str
    pid: int

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def finished_time(self) -> datetime:
        """When the container last exited (docker's RFC 3339 time with nanoseconds, to microseconds)."""
        return _docker_time(self.finished_at)

    @property
    def started_time(self) -> datetime:
        """When the container last started."""
        return _docker_time(self.started_at)


def _docker_time(text: str) -> datetime:
    """Docker's RFC 3339 time with nanoseconds (`2025-01-01T00:00:01.123456789Z`), to microseconds."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", text).replace("Z", "+00:00"))


class Cluster:
    """A docker network and the containers on it; `close()` (or the with-block) removes them all.

    Pod IPs are fixed (`--ip`) on a /24 network the cluster picks, so `status.podIP` can be a
    literal value in the environment and a restarted container keeps its address, as a restarted
    container of a pod does.
    """

    def __init__(self, run_id: str, host_dir: Path) -> None:
        self.run_id = run_id
        self.network = f"maskrcnn-e2e-{run_id}"
        self.host_dir = host_dir
        self.containers: list[str] = []
        self.subnet: ipaddress.IPv4Network | None = None
        self._next_host = 10
        self._ips: dict[str, str] = {}

    # -- lifetime --------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        self.host_dir.mkdir(parents=True, exist_ok=True)
        last = None
        for _ in range(20):
            subnet = ipaddress.ip_network(f"10.{random.randint(100, 250)}.{random.randint(0, 255)}.0/24")
            proc = docker(
                "network", "create", "--driver", "bridge", "--subnet", str(subnet),
                "--label", f"{LABEL}=1", "--label", f"{LABEL}.run={self.run_id}", self.network,
                check=False,
            )  # fmt: skip
            if proc.returncode == 0:
                self.subnet = subnet
                log.info("network %s (%s)", self.network, subnet)
                return
            last = proc.stderr.strip()
        raise DockerError(f"could not create network {self.network}: {last}")

    def close(self) -> None:
        """Remove every container this cluster made, then the network. Never raises."""
        for name in reversed(self.containers):
            docker("rm", "--force", "--volumes", name, check=False, timeout=60)
        self.containers.clear()
        if self.subnet is not None:
            docker("network", "rm", self.network, check=False, timeout=60)
            self.subnet = None
        # Files the containers wrote belong to their user; root (the harness) removes them all.
        shutil.rmtree(self.host_dir, ignore_errors=True)

    # -- addresses ---------------------------------------------------------------------------

    def ip_for(self, name: str) -> str:
        if name not in self._ips:
            assert self.subnet is not None, "open() the cluster first"
            self._ips[name] = str(self.subnet.network_address + self._next_host)
            self._next_host += 1
        return self._ips[name]

    # -- containers ----------------------------------------------------------------------------

    def container_name(self, pod: PodSpec) -> str:
        return f"e2e-{self.run_id}-{pod.name}"

    def create_pod(self, pod: PodSpec, image: str | None = None, labels: dict[str, str] | None = None) -> str:
        name = self.container_name(pod)
        args = docker_run_args(
            pod, name, self.network, image or pod.image, self.host_dir,
            {f"{LABEL}.run": self.run_id, f"{LABEL}.pod": pod.name, **(labels or {})},
        )  # fmt: skip
        self.containers.append(name)
        docker("create", *args)
        return name

    def adopt(self, name: str) -> None:
        """Track a container made elsewhere (the docs' bare-node recipe) so close() removes it."""
        if name not in self.containers:
            self.containers.append(name)

    def start(self, *names: str) -> None:
        for name in names:
            docker("start", name)

    def kill(self, name: str, signal: str = "KILL") -> None:
        docker("kill", "--signal", signal, name)

    def restart(self, name: str, grace: int = 0) -> None:
        """Stop (SIGTERM, SIGKILL after `grace` seconds) and start one container: a lone container
        restart while its peers run on."""
        docker("restart", "--time", str(grace), name)

    def pause(self, name: str) -> None:
        """Freeze every process of a container (cgroup freezer): a hung node, no closed connection."""
        docker("pause", name)

    def unpause(self, name: str) -> None:
        docker("unpause", name)

    def exec(self, name: str, *command: str, timeout: float = 60) -> str:
        """Run a command inside a running container; its standard output."""
        return docker("exec", name, *command, timeout=timeout).stdout

    def run_once(
        self, name: str, image: str, args: Sequence[str], *, user: str, mounts: Sequence[str], timeout: float
    ) -> None:
        """A one-off container beside the pods, without network, until it exits (what a user runs by
        hand before deploying, e.g. to put a dataset on a volume); close() removes it."""
        self.adopt(name)
        mount_args = [a for m in mounts for a in ("--mount", m)]
        docker(
            "run", "--name", name, "--label", f"{LABEL}=1", "--user", user, "--network", "none", *mount_args,
            image, *args, timeout=timeout,
        )  # fmt: skip

    def stop(self, names: Sequence[str], grace: float) -> None:
        """What deleting pods does: SIGTERM, then SIGKILL `grace` seconds later (the pods' grace period,
        `docker stop --time`); returns once all have stopped."""
        docker("stop", "--time", str(int(grace)), *names, timeout=grace + 60)
        self.wait_exit(names, timeout=30)

    def state(self, name: str) -> ContainerState:
        out = docker("inspect", "--format", "{{json .State}}", name).stdout
        s = json.loads(out)
        return ContainerState(s["Status"], int(s["ExitCode"]), s["StartedAt"], s["FinishedAt"], int(s["Pid"]))

    def logs(self, name: str) -> str:
        proc = docker("logs", name, check=False, timeout=60)
        return proc.stdout + proc.stderr

    def wait_exit(self, names: Sequence[str], timeout: float, poll: float = 1.0) -> dict[str, ContainerState]:
        """Wait until every container has stopped; DockerError naming those still running at the bound."""
        deadline = time.monotonic() + timeout
        while True:
            states = {n: self.state(n) for n in names}
            running = [n for n, s in states.items() if s.running or s.status in ("created", "restarting")]
            if not running:
                return states
            if time.monotonic() > deadline:
                raise DockerError(f"still running after {timeout:.0f}s: {', '.join(running)}")
            time.sleep(poll)

    def save_logs(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for name in self.containers:
            (folder / f"{name}.log").write_text(self.logs(name))


def daemon_answers() -> bool:
    return docker("info", check=False, timeout=30).returncode == 0


def image_exists(image: str) -> bool:
    return docker("image", "inspect", image, check=False).returncode == 0


def clean_all(session: str = "") -> int:
    """Remove every container and network labelled by this harness (leftovers of a killed run); with
    `session`, only that harness run's (its containers are `e2e-<run id>-...`, its networks
    `maskrcnn-e2e-<run id>`, and each of its run ids starts with the session)."""
    only = ["--filter", f"name=e2e-{session}"] if session else []
    ids = docker("ps", "-aq", "--filter", f"label={LABEL}", *only, check=False).stdout.split()
    if ids:
        docker("rm", "--force", *ids, check=False, timeout=120)
    nets = docker("network", "ls", "-q", "--filter", f"label={LABEL}", *only, check=False).stdout.split()
    for net in nets:
        docker("network", "rm", net, check=False)
    return len(ids) + len(nets)
