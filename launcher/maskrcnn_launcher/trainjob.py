"""Kubeflow Trainer v2's torch runtime as an identity source: the PET_* variables its Torch plugin injects.

What a TrainJob's `node` container gets (kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/torch/torch.go
`EnforceMLPolicy`, names in pkg/constants/constants.go `TorchEnv*`):

    PET_NNODES          the TrainJob's numNodes (else the runtime's mlPolicy.numNodes), a decimal number
    PET_NPROC_PER_NODE  numProcPerNode as a number; `auto` when resourcesPerNode has GPUs and numProcPerNode
                        is not given (torchrun then starts one process per visible GPU); without GPUs the
                        plugin writes the CPU count. Older releases also wrote `gpu`, which torchrun reads alike
    PET_NODE_RANK       the downward API over metadata.annotations['batch.kubernetes.io/job-completion-index']
    PET_MASTER_ADDR     `<trainjob>-node-0-0.<trainjob>` (node 0 under the JobSet's subdomain, the TrainJob's name)
    PET_MASTER_PORT     `29500` (constants.ContainerTrainerPort)

They say which node this pod is and the job's shape; the topology says the rest (devices, network,
estimate). Where the two disagree the pod stops with one line per contradiction (exit 2): numNodes
against the topology's pod count, numProcPerNode against its devices, a pipeline topology (refused: a
TrainJob gives every node the same resourcesPerNode, the pipeline wants a CPU master and GPU stage
workers), and Trainer's port against the topology's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import (
    PET_MASTER_ADDR,
    PET_MASTER_PORT,
    PET_NNODES,
    PET_NODE_RANK,
    PET_NPROC_PER_NODE,
    TORCH_RUNTIME_VARS,
    parse_trainjob_master_addr,
    trainjob_role,
)
from maskrcnn_launcher.errors import IdentityError
from maskrcnn_launcher.topology import Topology

_COUNT = re.compile(r"[0-9]+")
# PET_NPROC_PER_NODE values that leave the count to torchrun (one process per visible GPU).
DEVICE_COUNTED = ("auto", "gpu")


@dataclass(frozen=True)
class TorchRuntime:
    """The PET_* variables of one pod, parsed."""

    nnodes: int
    node_rank: int
    nproc_per_node: int | None  # None: `auto`/`gpu`, the topology's devices decide
    nproc_text: str  # PET_NPROC_PER_NODE as given
    master_addr: str
    master_port: int

    @property
    def trainjob(self) -> str | None:
        """The TrainJob's name, when PET_MASTER_ADDR has the runtime's form."""
        return parse_trainjob_master_addr(self.master_addr)

    @property
    def role(self) -> tuple[str, int]:
        """(role, index) of this pod: node 0 is the master, node i is worker i - 1."""
        return trainjob_role(self.node_rank)

    @property
    def source(self) -> str:
        return f"Kubeflow Trainer torch runtime: {PET_NODE_RANK}={self.node_rank} of {PET_NNODES}={self.nnodes}"


def under_torch_runtime(env: Mapping[str, str]) -> bool:
    """Whether any PET_* variable is set: the pod runs under Trainer's torch runtime."""
    return any(env.get(name) for name in TORCH_RUNTIME_VARS)


def read_torch_runtime(env: Mapping[str, str]) -> TorchRuntime | None:
    """The torch runtime's variables, or None when none is set; `IdentityError` naming every problem."""
    if not under_torch_runtime(env):
        return None
    missing = [name for name in TORCH_RUNTIME_VARS if not env.get(name)]
    if missing:
        given = [name for name in TORCH_RUNTIME_VARS if env.get(name)]
        raise IdentityError(
            f"{', '.join(missing)}: not set, while {', '.join(given)} {'is' if len(given) == 1 else 'are'}: "
            f"Kubeflow Trainer's torch runtime sets all of {', '.join(TORCH_RUNTIME_VARS)}"
        )
    errors: list[str] = []
    nnodes = _count(env, PET_NNODES, errors, minimum=1)
    node_rank = _count(env, PET_NODE_RANK, errors, minimum=0)
    port = _count(env, PET_MASTER_PORT, errors, minimum=1)
    nproc_text = env[PET_NPROC_PER_NODE]
    nproc = None if nproc_text in DEVICE_COUNTED else _count(env, PET_NPROC_PER_NODE, errors, minimum=1)
    if port is not None and port > 65535:
        errors.append(f"{PET_MASTER_PORT}: {port} is out of range 1..65535")
    if nnodes is not None and node_rank is not None and node_rank >= nnodes:
        errors.append(f"{PET_NODE_RANK}={node_rank} is not below {PET_NNODES}={nnodes}")
    if errors:
        raise IdentityError(errors)
    return TorchRuntime(nnodes, node_rank, nproc, nproc_text, env[PET_MASTER_ADDR], port)


def checked_torch_runtime(env: Mapping[str, str], topology: Topology) -> TorchRuntime | None:
    """The torch runtime's variables when set, once they agree with `topology`; `IdentityError` listing
    every contradiction otherwise."""
    runtime = read_torch_runtime(env)
    if runtime is not None and (problems := contradictions(runtime, topology)):
        raise IdentityError(problems)
    return runtime


def contradictions(runtime: TorchRuntime, topology: Topology) -> list[str]:
    """Where the torch runtime's variables and the topology disagree, one line each (empty: they agree)."""
    source = topology.source
    if topology.engine != "ddp":
        return [
            f"{source}: engine {topology.engine} does not run under Kubeflow Trainer's torch runtime "
            f"({PET_NNODES} is set): a TrainJob gives every node the same resourcesPerNode and starts them "
            "under torchrun, the pipeline wants a CPU master and GPU stage workers with one process each; "
            "run it with the chart's StatefulSets or JobSet, or give a ddp topology"
        ]
    problems = []
    if runtime.nnodes != topology.nnodes:
        problems.append(
            f"{PET_NNODES}={runtime.nnodes} but {source} names {topology.nnodes} pod(s) (the master and "
            f"{len(topology.workers)} worker(s)): set the TrainJob's numNodes to {topology.nnodes}, or give a "
            f"topology of {runtime.nnodes} pods"
        )
    devices = {topology.master_devices, *(w.devices for w in topology.workers)}
    if len(devices) > 1:
        problems.append(
            f"{source}: the pods have {' and '.join(map(str, sorted(devices)))} devices, but a TrainJob gives every "
            "node the same resourcesPerNode: give the master and every worker the same devices"
        )
    nproc = max(topology.master_devices, 1)
    if runtime.nproc_per_node is not None and runtime.nproc_per_node != nproc:
        problems.append(
            f"{PET_NPROC_PER_NODE}={runtime.nproc_text} but {source} runs {nproc} process(es) per pod (devices "
            f"{topology.master_devices}: one per GPU, one on CPU): set the TrainJob's numProcPerNode to {nproc}"
        )
    if runtime.master_port != topology.network.master_port:
        problems.append(
            f"{PET_MASTER_PORT}={runtime.master_port} but {source} has network.master_port "
            f"{topology.network.master_port}: under the torch runtime the rendezvous port is Trainer's (the node "
            "container's port, and the one the TrainJob's NetworkPolicy admits); set network.master_port to "
            f"{runtime.master_port}"
        )
    return problems


def explain(runtime: TorchRuntime, topology: Topology) -> list[str]:
    """What the launcher took from each variable, for `plan`, `validate` and `launch --dry-run`."""
    role, index = runtime.role
    who = "the master" if role == "master" else f"worker {index}"
    nproc = max(topology.master_devices, 1)
    counted = "" if runtime.nproc_per_node is not None else ", from the topology's devices"
    trainjob = f" (TrainJob {runtime.trainjob})" if runtime.trainjob else ""
    return [
        f"Kubeflow Trainer torch runtime{trainjob}, from this pod's environment:",
        f"  {PET_NNODES}={runtime.nnodes}: {runtime.nnodes} node(s), the topology's master and "
        f"{runtime.nnodes - 1} worker(s) (torchrun --nnodes {runtime.nnodes})",
        f"  {PET_NODE_RANK}={runtime.node_rank}: this pod is node {runtime.node_rank}, {who} "
        f"(torchrun --node-rank {runtime.node_rank})",
        f"  {PET_NPROC_PER_NODE}={runtime.nproc_text}: {nproc} process(es) per node{counted} "
        f"(torchrun --nproc-per-node {nproc})",
        f"  {PET_MASTER_ADDR}={runtime.master_addr}, {PET_MASTER_PORT}={runtime.master_port}: the master "
        "(torchrun --master-addr, --master-port)",
    ]


def _count(env: Mapping[str, str], name: str, errors: list[str], minimum: int) -> int | None:
    value = env[name]
    # Plain decimal digits, as the plugin writes them (fmt "%d"): an elastic range "1:4" is not one.
    if _COUNT.fullmatch(value) is None or int(value) < minimum:
        errors.append(f"{name}: {value!r} is not a whole number >= {minimum}" + _elastic(name, value))
        return None
    return int(value)


def _elastic(name: str, value: str) -> str:
    if name == contract.PET_NNODES and ":" in value:
        return " (an elastic min:max node range: the kit runs a fixed number of nodes)"
    return ""
