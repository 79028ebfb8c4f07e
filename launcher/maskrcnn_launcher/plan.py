"""Derivation: a validated topology + addressing -> one `PodPlan` per pod (the job plan)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from maskrcnn_launcher.contract import LinkEstimate, PodPlan, StagePlacement
from maskrcnn_launcher.devicemaps import pipeline_device_maps, replica_devices
from maskrcnn_launcher.estimate import ddp_links, pipeline_links
from maskrcnn_launcher.identity import Cluster, Identity
from maskrcnn_launcher.topology import Topology


@dataclass(frozen=True)
class JobPlan:
    topology: Topology
    pods: tuple[PodPlan, ...]  # node-rank order: master, worker 0, worker 1, ...
    links: tuple[LinkEstimate, ...]

    def pod(self, role: str, index: int) -> PodPlan:
        return next(p for p in self.pods if p.role == role and p.index == index)


def rpc_name(role: str, index: int) -> str:
    """`master`, or `worker<i+1>` for worker ordinal i (so the name matches the rank)."""
    return "master" if role == "master" else f"worker{index + 1}"


def backend(devices: int) -> str:
    return "nccl" if devices > 0 else "gloo"


def stage_placements(topology: Topology) -> tuple[StagePlacement, ...]:
    placements = []
    for position, stage in enumerate(topology.stages, start=1):
        worker = topology.worker_for_stage(stage.name)
        placements.append(
            StagePlacement(
                stage=position,
                name=stage.name,
                worker_index=worker.index,
                rank=worker.index + 1,
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
    maps = pipeline_device_maps(stages, topology.network.transport)
    links = pipeline_links(topology, stages) if topology.engine == "pipeline" else ddp_links(topology, names)
    pods = []
    first_rank = 0
    for node_rank, (role, index, devices) in enumerate(roles):
        name = rpc_name(role, index)
        own = next((s for s in stages if s.rpc_name == name), None)
        nproc = max(devices, 1) if topology.engine == "ddp" else 1
        pods.append(
            PodPlan(
                engine=topology.engine,
                role=role,
                index=index,
                # ddp: torchrun gives node n the global ranks after those of nodes 0..n-1.
                rank=first_rank if topology.engine == "ddp" else node_rank,
                world_size=topology.world_size,
                rpc_name=name,
                master_addr=master_addr,
                master_port=master_port,
                backend=backend(devices),
                devices=devices,
                nnodes=topology.nnodes,
                node_rank=node_rank,
                nproc_per_node=nproc,
                stages=stages,
                stage=own.stage if own else None,
                modules=own.modules if own else (),
                replicas=own.devices if own else (),
                transport=topology.network.transport,
                device_maps=maps.get(name, {}),
                socket_ifname=topology.network.interface,
                feature_dtype=topology.estimate.feature_dtype,
                micro_batches=topology.estimate.micro_batches,
                links=tuple(links),
                dns_name=cluster.dns_name(role, index) if cluster else None,
            )
        )
        first_rank += nproc
    return JobPlan(topology, tuple(pods), tuple(links))


def derive_pod(topology: Topology, identity: Identity) -> PodPlan:
    """This pod's record, with the addressing the identity found."""
    job = derive_job(topology, identity.master_addr, identity.master_port, identity.cluster)
    return replace(job.pod(identity.role, identity.index), pod_ip=identity.pod_ip)
