"""What a topology asks of the host a pod runs on, checked there before the trainer starts.

- `network.interface`: gloo, NCCL and TensorPipe bind the interface the topology names (the launcher
  exports it as *_SOCKET_IFNAME); one this host lacks fails at the first collective, deep in gloo. On the
  pod's own host (`launch`, and `local`, whose pods all run here) it is refused in one line; `validate` and
  `plan`, which may run on another machine than the pods, warn.
- GPUs: a ddp topology whose pods have `devices: N` on a host without a GPU still runs: torchrun starts N
  ranks per pod and each falls back to the CPU over gloo. A user who meant GPUs is told once (a
  pipeline's stage replicas are placed on the GPUs and fail without them: told the same way).

Standard library only: the launcher runs without torch, so the GPUs are the NVIDIA driver's devices.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from maskrcnn_launcher.topology import Topology

_GPU_NODE = re.compile(r"^nvidia\d+$")


def host_interfaces() -> list[str] | None:
    """This host's network interfaces, or None where the platform cannot list them."""
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return None


def interface_problem(
    topology: Topology, interfaces: Sequence[str] | None = None, pods_here: bool = True
) -> str | None:
    """Why the topology's `network.interface` cannot be used on this host, or None. `pods_here`: this is
    the pods' host (`launch`, `local`), else a machine that only checks the topology (a warning's words)."""
    name = topology.network.interface
    interfaces = host_interfaces() if interfaces is None else interfaces
    if name is None or interfaces is None or name in interfaces:
        return None
    missing = (
        f"{topology.source}: network.interface {name!r} is not an interface of this host "
        f"(it has {', '.join(interfaces)})"
    )
    if not pods_here:
        return f"{missing}; `launch` refuses it on a pod's host that lacks it (fine if the pods' hosts have it)"
    return (
        f"{missing}: gloo, NCCL and TensorPipe bind it for every collective; name one of these, or leave "
        "network.interface out"
    )


def visible_gpus(env: Mapping[str, str], dev: Path = Path("/dev")) -> int | None:
    """NVIDIA GPUs this process can use: the driver's device nodes, narrowed by CUDA_VISIBLE_DEVICES;
    None where that cannot be told (no /dev, or WSL's /dev/dxg, behind which GPUs have no nodes of their own)."""
    try:
        names = [entry.name for entry in os.scandir(dev)]
    except OSError:
        return None
    if "dxg" in names:
        return None
    present = sum(1 for name in names if _GPU_NODE.match(name))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    listed = [d for d in visible.split(",") if d.strip()]
    return 0 if not listed or listed[0].strip() == "-1" else min(present, len(listed))


def cpu_fallback_warning(topology: Topology, pods_here: Sequence[int], gpus: int | None) -> str | None:
    """The one line that says a topology asking for GPUs runs on the CPU here (`pods_here`: the node
    ranks that run on this host), or None."""
    wanted = [topology.node_devices()[rank] for rank in pods_here]
    if gpus is None or gpus > 0 or not any(wanted):
        return None
    pods = "this pod" if len(pods_here) == 1 else f"{len(pods_here)} pods"
    if topology.engine == "ddp":
        ranks = sum(max(d, 1) for d in wanted)
        fallback = (
            f"torchrun starts {'+'.join(str(max(d, 1)) for d in wanted)} = {ranks} rank(s) all the same, each "
            "on the CPU over gloo (--device auto)"
        )
    else:
        fallback = "the pipeline places its stage replicas on those GPUs, and a stage worker that finds none fails"
    return (
        f"{topology.source} asks for {sum(wanted)} GPU(s) on {pods} (devices: {', '.join(map(str, wanted))}) "
        f"and this host has none: {fallback}; for CPU training use a topology with devices: 0"
    )
