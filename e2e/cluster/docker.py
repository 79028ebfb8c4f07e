"""Pods as docker containers on a user-defined network, and a `Cluster` that always cleans up.

`docker_run_args(pod, ...)` maps a `PodSpec` onto `docker run` as closely as docker allows:

| pod spec                                   | docker                                            |
|--------------------------------------------|---------------------------------------------------|
| hostname (the pod name, or spec.hostname)  | `--hostname <host>`                               |
| headless Service DNS (`<pod>.<svc>...`)    | `--network-alias` for every name, `--dns-search`  |
| status.podIP                               | `--ip` (a fixed address on the test network)      |
| env (downward API resolved), command, args | `-e`, `--entrypoint`, arguments after the image   |
| configMap volume                           | the rendered files, bind-mounted read-only        |
| emptyDir (medium Memory at /dev/shm)       | `--shm-size <sizeLimit>`                          |
| emptyDir                                   | `--tmpfs` with its size limit, owned by the user  |
| persistentVolumeClaim                      | a host folder shared by the pods, group fsGroup   |
| runAsUser / runAsGroup / fsGroup           | `--user uid:gid`, `--group-add fsGroup`           |
| readOnlyRootFilesystem                     | `--read-only`                                     |
| capabilities.drop                          | `--cap-drop`                                      |
| allowPrivilegeEscalation: false            | `--security-opt no-new-privileges`                |
| seccompProfile RuntimeDefault              | docker's default seccomp profile                  |
| limits.memory / requests.cpu               | `--memory` / `--cpu-shares`                       |
| terminationGracePeriodSeconds              | `--stop-timeout`                                  |

Not simulated: an emptyDir here does not outlive a container restart (a tmpfs is per container
start; the kubelet keeps a pod's emptyDir across container restarts) and starts with the image
folder's content (docker's tmpfs copy-up), and there is no NetworkPolicy enforcement.

Every container and the network carry the label `maskrcnn-e2e`, so `python -m e2e clean` finds
leftovers of a harness that was itself killed.
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
from pathlib import Path

from .pods import PodSpec, SpecError

log = logging.getLogger("e2e")

LABEL = "maskrcnn-e2e"
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


_UNITS = {"": 1, "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
_BIN_UNITS = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4}


def quantity_bytes(q: str) -> int:
    """Kubernetes quantity (`512Mi`, `2Gi`, `1G`, `1000`) -> bytes."""
    m = re.fullmatch(r"([0-9.]+)([KMGT]i|[kMGT]?)", str(q).strip())
    if not m:
        raise SpecError(f"quantity {q!r} not understood")
    number, unit = float(m[1]), m[2]
    return int(number * (_BIN_UNITS.get(unit) or _UNITS[unit]))


def cpu_shares(q: str) -> int:
    """requests.cpu -> cgroup cpu shares, as the kubelet computes them (1 CPU = 1024)."""
    millis = float(q[:-1]) if q.endswith("m") else float(q) * 1000
    return max(2, int(millis * 1024 / 1000))


def docker_run_args(
    pod: PodSpec, container: str, network: str, image: str, host_dir: Path, labels: dict[str, str]
) -> list[str]:
    """`docker create` arguments for one pod. `host_dir` holds the configMap files and PVC folders."""
    if pod.gpus:
        raise SpecError(f"{pod.name}: asks for {pod.gpus} GPUs; the e2e harness runs CPU pods only")
    args = ["--name", container, "--hostname", pod.host, "--network", network, "--ip", pod.pod_ip]
    for name in pod.dns_names:
        args += ["--network-alias", name]
    for domain in pod.dns_search:
        args += ["--dns-search", domain]
    for key, value in {LABEL: "1", **labels}.items():
        args += ["--label", f"{key}={value}"]
    if pod.run_as_user is not None:
        args += ["--user", f"{pod.run_as_user}:{pod.run_as_group if pod.run_as_group is not None else 0}"]
    if pod.fs_group is not None:
        args += ["--group-add", str(pod.fs_group)]
    if pod.read_only_root:
        args.append("--read-only")
    for cap in pod.cap_drop:
        args += ["--cap-drop", cap]
    if pod.no_new_privileges:
        args += ["--security-opt", "no-new-privileges"]
    if pod.memory_limit:
        args += ["--memory", str(quantity_bytes(pod.memory_limit))]
    if pod.cpu_request:
        args += ["--cpu-shares", str(cpu_shares(pod.cpu_request))]
    args += ["--stop-timeout", str(pod.grace_seconds)]
    gid = pod.fs_group if pod.fs_group is not None else (pod.run_as_group or 0)
    for m in pod.mounts:
        if m.kind == "configMap":
            folder = host_dir / "configmaps" / container / m.path.strip("/").replace("/", "_")
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o755)
            for fname, content in m.files.items():
                (folder / fname).write_text(content)
                (folder / fname).chmod(0o644)
            args += ["--mount", f"type=bind,source={folder},target={m.path},readonly"]
        elif m.kind == "emptyDir" and m.medium == "Memory" and m.path == "/dev/shm":
            args += ["--shm-size", str(quantity_bytes(m.size_limit or "64Mi"))]
        elif m.kind == "emptyDir":
            # A kubelet emptyDir starts empty, mode 0777, group fsGroup. Docker copies the image
            # folder's content and mode into a tmpfs (no `notmpcopyup` in docker 20.10), so the
            # tmpfs is owned by the pod's user instead: writable by it, as the emptyDir is.
            opts = ["rw" if not m.read_only else "ro", f"mode=2777,gid={gid}"]
            if pod.run_as_user is not None:
                opts.append(f"uid={pod.run_as_user}")
            if m.size_limit:
                opts.append(f"size={quantity_bytes(m.size_limit)}")
            args += ["--tmpfs", f"{m.path}:{','.join(opts)}"]
        elif m.kind == "pvc":
            folder = pvc_dir(host_dir, m.claim, gid)
            args += ["--mount", f"type=bind,source={folder},target={m.path}" + (",readonly" if m.read_only else "")]
    for key, value in pod.env.items():
        args += ["-e", f"{key}={value}"]
    if pod.command is not None:
        args += ["--entrypoint", pod.command[0], image, *pod.command[1:], *pod.args]
    else:
        args += [image, *pod.args]
    return args


def pvc_dir(host_dir: Path, claim: str, gid: int) -> Path:
    """The host folder standing in for a PersistentVolumeClaim, writable by fsGroup like a real one."""
    folder = host_dir / "volumes" / claim
    if not folder.exists():
        folder.mkdir(parents=True)
        os.chown(folder, 0, gid)
        folder.chmod(0o2775)
    return folder


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
        """Track a container made elsewhere (the README recipe) so close() removes it."""
        if name not in self.containers:
            self.containers.append(name)

    def start(self, *names: str) -> None:
        for name in names:
            docker("start", name)

    def kill(self, name: str, signal: str = "KILL") -> None:
        docker("kill", "--signal", signal, name)

    def stop(self, names: Sequence[str], grace: float) -> None:
        """What deleting pods does: SIGTERM, then SIGKILL after each container's stop timeout (its pod's
        grace period, at most `grace`); returns once all have stopped."""
        docker("stop", *names, timeout=grace + 60)
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


def clean_all() -> int:
    """Remove every container and network labelled by this harness (leftovers of a killed run)."""
    ids = docker("ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
    if ids:
        docker("rm", "--force", *ids, check=False, timeout=120)
    nets = docker("network", "ls", "-q", "--filter", f"label={LABEL}", check=False).stdout.split()
    for net in nets:
        docker("network", "rm", net, check=False)
    return len(ids) + len(nets)
