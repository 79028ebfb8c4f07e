"""The recommended candidate as a topology file (what `maskrcnn-launch plan/launch/local --topology`
reads; the launcher validates it before writing) and as the chart's values (`helm install -f`)."""

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


def chart_values_problem(worker_devices: list[int], where: str = "") -> str | None:
    """Why the chart cannot describe workers with these device counts (None when it can): its
    worker.gpus is one value for every worker. Checked on the base topology before measuring."""
    if len(set(worker_devices)) <= 1:
        return None
    prefix = f"{where}: " if where else ""
    return (
        f"{prefix}workers have different device counts {sorted(set(worker_devices))}; the chart's worker.gpus "
        "is one value"
    )


# The run's batch and micro-batch count are the trainer's flags, which the chart's estimate derives from
# trainer.args: a values file that stated them in `estimate` as well could describe a run that never happens.
RUN_FLAGS_IN_ESTIMATE = {"batch_size": "--batch-size", "micro_batches": "--micro-batches"}


def chart_values(doc: dict[str, Any]) -> dict[str, Any]:
    """A topology document as the chart's values: the chart renders its topology ConfigMap from
    `engine`, `pipeline.stages` (with replicas), `ddp.workers`, `master.gpus`, `worker.gpus` and
    `estimate` (without the batch and micro-batch count: see RUN_FLAGS_IN_ESTIMATE). ValueError when the
    workers' devices differ: the chart gives every worker the same."""
    if problem := chart_values_problem([w["devices"] for w in doc["workers"]]):
        raise ValueError(problem)
    devices = {w["devices"] for w in doc["workers"]}
    values: dict[str, Any] = {"engine": doc["engine"], "master": {"gpus": doc["master"]["devices"]}}
    values["worker"] = {"gpus": devices.pop() if devices else 0}
    if doc["engine"] == "ddp":
        values["ddp"] = {"workers": len(doc["workers"])}
    else:
        replicas = {w["stage"]: w["replicas"] for w in doc["workers"]}
        values["pipeline"] = {
            "stages": [{**stage, "replicas": replicas[stage["name"]]} for stage in doc["stages"]],
            "transport": doc["network"]["transport"],
        }
    values["estimate"] = {k: v for k, v in doc["estimate"].items() if k not in RUN_FLAGS_IN_ESTIMATE}
    return values


def measured_run_flags(doc: dict[str, Any]) -> list[str]:
    """The trainer flags the recommendation was measured at, as they go into the chart's trainer.args."""
    return [part for key, flag in RUN_FLAGS_IN_ESTIMATE.items() for part in (flag, str(doc["estimate"][key]))]


def write_values(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(
        "# Written by `maskrcnn-dist profile`: helm install RELEASE helm/ -f THIS_FILE\n"
        f"# Measured at {' '.join(measured_run_flags(doc))}: give the same flags in trainer.args (the chart's\n"
        "# estimate takes the batch and micro-batch count from there).\n"
        + yaml.safe_dump(chart_values(doc), sort_keys=False)
    )
