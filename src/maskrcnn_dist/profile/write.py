"""The recommended candidate as a topology file: what `maskrcnn-launch plan/launch/local --topology`
reads and what the chart takes as its `topology:` values (the launcher validates it before writing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from maskrcnn_launcher.errors import TopologyError
from maskrcnn_launcher.topology import Topology, parse_topology

from .candidates import Candidate


def topology_document(
    cand: Candidate,
    base: Topology,
    batch: int,
    micro_batches: int,
    image_size: tuple[int, int],
    instances: int,
    feature_dtype: str,
) -> dict[str, Any]:
    """`base`'s pods and network with `cand`'s engine, stages and replicas."""
    doc: dict[str, Any] = {"engine": cand.engine}
    if cand.engine == "ddp":
        doc["master"] = {"devices": base.master_devices}
        doc["workers"] = [{"devices": w.devices} for w in base.workers]
    else:
        doc["master"] = {"devices": 0}
        names = [f"stage{i}" for i in range(1, len(cand.stages) + 1)]
        doc["workers"] = [
            {"devices": w.devices, "stage": name, "replicas": replicas}
            for w, name, replicas in zip(base.workers, names, cand.replicas, strict=False)
        ]
        doc["stages"] = [{"name": n, "modules": list(m)} for n, m in zip(names, cand.stages, strict=True)]
    doc["network"] = {
        "master_port": base.network.master_port,
        "interface": base.network.interface,
        "transport": base.network.transport,
    }
    doc["estimate"] = {
        "batch_size": batch,
        "image_size": list(image_size),
        "micro_batches": min(micro_batches, batch),
        "feature_dtype": feature_dtype,
        "instances_per_image": instances,
    }
    return doc


def launchable(cand: Candidate, base: Topology) -> bool:
    """Whether the launcher would accept `cand` on `base`'s pods: e.g. ddp needs every pod with GPUs
    or every pod without, and device maps need each GPU stage to have at least the previous one's
    replicas. The launcher's own parser decides, so the two can never disagree."""
    est = base.estimate
    doc = topology_document(
        cand, base, est.batch_size, est.micro_batches, est.image_size, est.instances_per_image, est.feature_dtype
    )
    try:
        parse_topology(doc)
    except TopologyError:
        return False
    return True


def write_topology(path: Path, doc: dict[str, Any]) -> None:
    """Validate `doc` with the launcher's own parser (TopologyError if it would not load), then write it."""
    parse_topology(doc, str(path))
    path.write_text(
        "# Written by `maskrcnn-dist profile`: the recommended engine, split and replicas.\n"
        + yaml.safe_dump(doc, sort_keys=False)
    )
