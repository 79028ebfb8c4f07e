"""A `PodSpec` as `docker create` arguments, as closely as docker allows:

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

Where this falls short of a kubelet (an emptyDir that does not outlive a container restart, no
NetworkPolicy, ...) is listed in README.md beside this file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .pods import Mount, PodSpec, SpecError

# Every container and network the harness makes carries this label, so `python -m e2e clean` finds
# the leftovers of a harness that was itself killed.
LABEL = "maskrcnn-e2e"

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
    return [
        *_network_args(pod, container, network, labels),
        *_security_args(pod),
        *_resource_args(pod),
        *_volume_args(pod, container, host_dir),
        *_process_args(pod, image),
    ]


def _network_args(pod: PodSpec, container: str, network: str, labels: dict[str, str]) -> list[str]:
    """Names, address and DNS: the pod's host name, IP and every name cluster DNS answers for it."""
    args = ["--name", container, "--hostname", pod.host, "--network", network, "--ip", pod.pod_ip]
    for name in pod.dns_names:
        args += ["--network-alias", name]
    for domain in pod.dns_search:
        args += ["--dns-search", domain]
    for key, value in {LABEL: "1", **labels}.items():
        args += ["--label", f"{key}={value}"]
    return args


def _security_args(pod: PodSpec) -> list[str]:
    """The security context: user and groups, read-only root, capabilities, no privilege escalation."""
    args = []
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
    return args


def _resource_args(pod: PodSpec) -> list[str]:
    args = []
    if pod.memory_limit:
        args += ["--memory", str(quantity_bytes(pod.memory_limit))]
    if pod.cpu_request:
        args += ["--cpu-shares", str(cpu_shares(pod.cpu_request))]
    return [*args, "--stop-timeout", str(pod.grace_seconds)]


def _volume_args(pod: PodSpec, container: str, host_dir: Path) -> list[str]:
    gid = pod.fs_group if pod.fs_group is not None else (pod.run_as_group or 0)
    args = []
    for m in pod.mounts:
        if m.kind == "configMap":
            folder = _configmap_folder(m, host_dir / "configmaps" / container)
            args += ["--mount", f"type=bind,source={folder},target={m.path},readonly"]
        elif m.kind == "emptyDir" and m.medium == "Memory" and m.path == "/dev/shm":
            args += ["--shm-size", str(quantity_bytes(m.size_limit or "64Mi"))]
        elif m.kind == "emptyDir":
            args += ["--tmpfs", f"{m.path}:{_tmpfs_options(m, pod, gid)}"]
        elif m.kind == "pvc":
            folder = pvc_dir(host_dir, m.claim, gid)
            args += ["--mount", f"type=bind,source={folder},target={m.path}" + (",readonly" if m.read_only else "")]
    return args


def _configmap_folder(m: Mount, parent: Path) -> Path:
    """The configMap's files on the host, world-readable as the kubelet's projection is."""
    folder = parent / m.path.strip("/").replace("/", "_")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    for fname, content in m.files.items():
        (folder / fname).write_text(content)
        (folder / fname).chmod(0o644)
    return folder


def _tmpfs_options(m: Mount, pod: PodSpec, gid: int) -> str:
    # A kubelet emptyDir starts empty, mode 0777, group fsGroup. Docker copies the image
    # folder's content and mode into a tmpfs (no `notmpcopyup` in docker 20.10), so the
    # tmpfs is owned by the pod's user instead: writable by it, as the emptyDir is.
    opts = ["rw" if not m.read_only else "ro", f"mode=2777,gid={gid}"]
    if pod.run_as_user is not None:
        opts.append(f"uid={pod.run_as_user}")
    if m.size_limit:
        opts.append(f"size={quantity_bytes(m.size_limit)}")
    return ",".join(opts)


def _process_args(pod: PodSpec, image: str) -> list[str]:
    """Environment, then the image with the pod's command (as the entrypoint) and arguments."""
    args = []
    for key, value in pod.env.items():
        args += ["-e", f"{key}={value}"]
    if pod.command is not None:
        return [*args, "--entrypoint", pod.command[0], image, *pod.command[1:], *pod.args]
    return [*args, image, *pod.args]


def pvc_dir(host_dir: Path, claim: str, gid: int) -> Path:
    """The host folder standing in for a PersistentVolumeClaim, writable by fsGroup like a real one."""
    folder = host_dir / "volumes" / claim
    if not folder.exists():
        folder.mkdir(parents=True)
        os.chown(folder, 0, gid)
        folder.chmod(0o2775)
    return folder
