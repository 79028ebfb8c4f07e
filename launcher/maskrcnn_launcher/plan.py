"""Derivation: a validated topology + addressing -> one `PodLaunch` per pod (the job plan).

Two records per pod, on purpose: the `contract.PodPlan` the trainer reads (exported as
`MASKRCNN_POD_PLAN`), and around it the launcher's own `PodLaunch` with what only starting the pod
needs (GPU count and torchrun's node layout, the socket interface, the pod's DNS name and IP). The
byte estimate's inputs and results belong to the job (`JobPlan.links`, the topology's `estimate:`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import PodPlan, StagePlacement, node_rank, process_group_backend
from maskrcnn_launcher.devicemaps import pipeline_device_maps, replica_devices, resolved_transport
from maskrcnn_launcher.estimate import LinkEstimate, ddp_links, pipeline_links
from maskrcnn_launcher.identity import Cluster, Identity
from maskrcnn_launcher.topology import Topology


@dataclass(frozen=True)
class PodLaunch:
    """How the launcher starts one pod: the trainer's `plan` and the facts only the launcher uses."""

    plan: PodPlan
    devices: int  # GPUs this pod has (0: CPU only)
    nnodes: int  # pods in the job (torchrun --nnodes)
    node_rank: int  # master 0, worker i -> i + 1 (torchrun --node-rank; the pipeline rank)
    nproc_per_node: int  # pipeline: 1; ddp: devices, or 1 on CPU (torchrun --nproc-per-node)
    socket_ifname: str | None = None  # exported as TP_/GLOO_/NCCL_SOCKET_IFNAME when set
    dns_name: str | None = None  # this pod's stable DNS name when known (Kubernetes)
    pod_ip: str | None = None  # from the downward API, for logs

    @property
    def own_stage(self) -> StagePlacement | None:
        """This pod's stage in the plan's placement; None for the master and under ddp."""
        return next((s for s in self.plan.stages if s.rpc_name == self.plan.rpc_name), None)

    @property
    def stage(self) -> int | None:
        """This pod's 1-based stage position, or None."""
        own = self.own_stage
        return own.stage if own else None

    @property
    def modules(self) -> tuple[str, ...]:
        own = self.own_stage
        return own.modules if own else ()

    @property
    def replicas(self) -> tuple[str, ...]:
        """This pod's replica devices, e.g. ("cuda:0", "cuda:1") or ("cpu",); () without a stage."""
        own = self.own_stage
        return own.devices if own else ()

    def exported_env(self) -> dict[str, str]:
        """What `launch` adds to the trainer's environment (see `contract.exported_env`)."""
        return contract.exported_env(self.plan, self.socket_ifname)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobPlan:
    topology: Topology
    launches: tuple[PodLaunch, ...]  # node-rank order: master, worker 0, worker 1, ...
    links: tuple[LinkEstimate, ...]  # every link of the job, estimated bytes per step

    @property
    def pods(self) -> tuple[PodPlan, ...]:
        """The trainer's records, node-rank order."""
        return tuple(launch.plan for launch in self.launches)

    def launch(self, role: str, index: int) -> PodLaunch:
        return next(p for p in self.launches if p.plan.role == role and p.plan.index == index)

    def pod(self, role: str, index: int) -> PodPlan:
        return self.launch(role, index).plan


def rpc_name(role: str, index: int) -> str:
    """`master`, or `worker<i+1>` for worker ordinal i (so the name matches the rank)."""
    return "master" if role == "master" else f"worker{index + 1}"


def stage_placements(topology: Topology) -> tuple[StagePlacement, ...]:
    placements = []
    for position, stage in enumerate(topology.stages, start=1):
        worker = topology.worker_for_stage(stage.name)
        placements.append(
            StagePlacement(
                stage=position,
                name=stage.name,
                worker_index=worker.index,
                rank=node_rank("worker", worker.index),
                rpc_name=rpc_name("worker", worker.index),
                modules=stage.modules,
                devices=replica_devices(worker),
            )
        )
    return tuple(placements)


def derive_job(topology: Topology, master_addr: str, master_port: int, cluster: Cluster | None = None) -> JobPlan:
    roles = [("master", 0, topology.master_devices)] + [("worker", w.index, w.devices) for w in topology.workers]
    names = [rpc_name(role, index) for role, index, _ in roles]
    stages = stage_placements(topology) if topology.engine == "pipeline" else ()
    transport = resolved_transport(stages, topology.network.transport)
    maps = pipeline_device_maps(stages, transport)
    links = pipeline_links(topology, stages) if topology.engine == "pipeline" else ddp_links(topology, names)
    launches = []
    first_rank = 0
    for role, index, devices in roles:
        name = rpc_name(role, index)
        node = node_rank(role, index)
        nproc = max(devices, 1) if topology.engine == "ddp" else 1
        plan = PodPlan(
            engine=topology.engine,
            role=role,
            index=index,
            # ddp: torchrun gives node n the global ranks after those of nodes 0..n-1.
            rank=first_rank if topology.engine == "ddp" else node,
            world_size=topology.world_size,
            rpc_name=name,
            master_addr=master_addr,
            master_port=master_port,
            backend=process_group_backend(uses_gpu=devices > 0),
            stages=stages,
            transport=transport,
            device_maps=maps.get(name, {}),
        )
        launches.append(
            PodLaunch(
                plan=plan,
                devices=devices,
                nnodes=topology.nnodes,
                node_rank=node,
                nproc_per_node=nproc,
                socket_ifname=topology.network.interface,
                dns_name=cluster.dns_name(role, index) if cluster else None,
            )
        )
        first_rank += nproc
    return JobPlan(topology, tuple(launches), tuple(links))


def derive_pod(topology: Topology, identity: Identity) -> PodLaunch:
    """This pod's records, with the addressing the identity found."""
    job = derive_job(topology, identity.master_addr, identity.master_port, identity.cluster)
    return replace(job.launch(identity.role, identity.index), pod_ip=identity.pod_ip)
