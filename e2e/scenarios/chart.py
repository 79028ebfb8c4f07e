"""The chart the scenarios deploy: its ci/ values files, `helm template`, and the pods it renders.

`helm template` stands in for `helm install`: its objects are what the emulated cluster receives.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..cluster import PodSpec, SpecError, statefulset_pods

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm"
CPU_VALUES = CHART / "ci" / "cpu-values.yaml"
DDP_VALUES = CHART / "ci" / "ddp-values.yaml"
# ci/ddp-values.yaml describes GPU machines; the overlay keeps its engine and storage layout but
# runs two CPU pods (master + 1 worker, gloo) with small requests.
DDP_CPU_OVERLAY = {
    "ddp": {"workers": 1},
    "master": {"gpus": 0, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}},
    "worker": {"gpus": 0, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}},
    "shmSize": "512Mi",
    "scratchSize": "1Gi",
}


@dataclass
class Release:
    """What `helm template` rendered: the pods in StatefulSet order, and every object by kind/name."""

    name: str
    namespace: str
    pods: list[PodSpec]
    objects: list[dict[str, Any]]

    def pod(self, component: str, ordinal: int = 0) -> PodSpec:
        for p in self.pods:
            if p.component == component and p.ordinal == ordinal:
                return p
        raise KeyError(f"no {component} pod with ordinal {ordinal} in {[p.name for p in self.pods]}")

    @property
    def master(self) -> PodSpec:
        """The master pod; among a TrainJob's nodes (component `node`), node 0."""
        nodes = any(p.component == "node" for p in self.pods)
        return self.pod("node", 0) if nodes else self.pod("master")

    @property
    def workers(self) -> list[PodSpec]:
        """The workers in ordinal order; a TrainJob's nodes 1, 2, ..."""
        workers = [p for p in self.pods if p.component == "worker" or (p.component == "node" and p.ordinal > 0)]
        return sorted(workers, key=lambda p: p.ordinal)


def helm_template(
    helm: str, release: str, namespace: str, values_files: Sequence[Path], chart: Path = CHART, timeout: float = 120
) -> list[dict[str, Any]]:
    cmd = [helm, "template", release, str(chart), "--namespace", namespace]
    for path in values_files:
        cmd += ["-f", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SpecError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def render_release(
    helm: str, release: str, namespace: str, values_files: Sequence[Path], pod_ips: Callable[[str], str]
) -> Release:
    objects = helm_template(helm, release, namespace, values_files)
    return Release(release, namespace, statefulset_pods(objects, namespace, pod_ips), objects)
