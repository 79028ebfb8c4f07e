"""The job plan as a table for people or JSON for programs.

JSON: `{"topology", "engine", "world_size", "estimate", "links", "pods"}`; each pod is a `PodLaunch`
whose `plan` is exactly the `MASKRCNN_POD_PLAN` that pod's trainer gets. The byte estimate's inputs
and the links are the job's, printed once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from maskrcnn_launcher.estimate import padded_size
from maskrcnn_launcher.plan import JobPlan, PodLaunch


def plan_json(job: JobPlan, derived: Sequence[str] = ()) -> str:
    """`derived`: what the plan took from the environment (Kubeflow Trainer's PET_*), one line each."""
    topo = job.topology
    doc = {
        "topology": topo.source,
        "engine": topo.engine,
        "world_size": topo.world_size,
        "estimate": asdict(topo.estimate),
        "links": [asdict(link) for link in job.links],
        "pods": [pod.to_dict() for pod in job.launches],
    }
    if derived:
        doc["derived"] = list(derived)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def plan_table(job: JobPlan, derived: Sequence[str] = ()) -> str:
    topo = job.topology
    master = job.pods[0]  # every pod records the same master address and port
    est = topo.estimate
    h, w = padded_size(est)
    head = f"topology {topo.source}: engine {topo.engine}, world size {topo.world_size}, "
    head += f"master {master.master_addr}:{master.master_port}"
    if topo.engine == "pipeline":
        transport = job.pods[0].transport
        head += f", transport {transport}" + (" (auto)" if topo.network.transport == "auto" else "")
    if topo.network.interface:
        head += f", interface {topo.network.interface}"
    lines = [head, *derived, ""]
    header = (
        "rank",
        "role",
        "rpc name",
        "dns name",
        "backend",
        "procs",
        "stage",
        "modules",
        "replicas",
        "device maps",
    )
    rows = [_pod_row(pod) for pod in job.launches]
    lines += _table(header, rows)
    if topo.engine == "pipeline":
        basis = (
            f"batch {est.batch_size} at {h}x{w} padded, {est.micro_batches} micro-batches, "
            f"features {est.feature_dtype}, {est.instances_per_image} instances per image"
        )
    else:
        basis = f"ring all-reduce of {est.model_parameters:,} float32 gradients per process"
    lines += ["", f"links, estimated per step ({basis}):"]
    link_rows = [
        (
            link.src,
            link.dst,
            link.phase,
            link.carries,
            str(link.messages_per_step),
            _bytes(link.bytes_per_step),
        )
        for link in job.links
    ]
    lines += _table(("from", "to", "phase", "carries", "messages", "bytes/step"), link_rows)
    return "\n".join(lines) + "\n"


def _pod_row(pod: PodLaunch) -> tuple[str, ...]:
    plan = pod.plan
    last = plan.rank + pod.nproc_per_node - 1
    ranks = str(plan.rank) if last == plan.rank else f"{plan.rank}-{last}"
    role = "master" if plan.role == "master" else f"worker {plan.index}"
    if plan.engine == "ddp":
        stage, modules = "-", "all"
        replicas = ", ".join([f"cuda:{i}" for i in range(pod.devices)] or ["cpu"])
    else:
        own = pod.own_stage
        stage = own.name if own else "-"
        modules = ", ".join(pod.modules) or "-"
        replicas = ", ".join(pod.replicas) or "-"
    maps = (
        "; ".join(
            f"{callee}: " + ", ".join(f"{a}->{b}" for a, b in sorted(mapping.items()))
            for callee, mapping in sorted(plan.device_maps.items())
        )
        or "-"
    )
    return (
        ranks,
        role,
        plan.rpc_name,
        pod.dns_name or "-",
        plan.backend,
        str(pod.nproc_per_node),
        stage,
        modules,
        replicas,
        maps,
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def _bytes(n: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n:,} B)"
    return f"{n} B"
