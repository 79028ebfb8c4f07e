"""Helpers over the chart's rendered objects, shared by the chart tests: which workload a render holds,
its pod templates by role, its topology as the launcher parses it, and label selectors (validation
against the cluster's schemas is validate.py's).

Every ci/ scenario (and the defaults) is rendered twice: for a cluster without JobSet (StatefulSets,
unless the scenario asks for a JobSet) and for one that serves jobset.x-k8s.io/v1alpha2 (`workload:
auto` renders a JobSet): CASES.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from maskrcnn_launcher import contract
from maskrcnn_launcher.topology import parse_topology

from .conftest import CHART, SCENARIOS


def trains_with_kubeflow(values_file: Path | None) -> bool:
    """Whether a scenario renders a Kubeflow training runtime instead of the release's own pods."""
    values = yaml.safe_load(values_file.read_text()) if values_file else {}
    return bool(((values or {}).get("kubeflowTrainer") or {}).get("runtime", {}).get("enabled"))


# The scenarios whose release trains with its own pods (StatefulSets or a JobSet); those that render a
# Kubeflow training runtime instead are test_kubeflow.py's.
SCENARIO_NAMES = [s for s, path in SCENARIOS.items() if not trains_with_kubeflow(path)]
KUBEFLOW_SCENARIOS = [s for s, path in SCENARIOS.items() if trains_with_kubeflow(path)]
GPU = "nvidia.com/gpu"
# (scenario, rendered as for a cluster that serves the JobSet API)
CASES = [(s, api) for s in SCENARIO_NAMES for api in (False, True)]
CASE_IDS = [f"{s}+jobset-api" if api else s for s, api in CASES]
# The JobSet's replicated jobs -> the launcher's roles (the contract's layout of the chart's JobSet).
REPLICATED_JOBS = {rjob: role for role, rjob in contract.REPLICATED_JOBS.items()}
# An extra volume (--set), for the cases that mount one.
VOLUME = "extraVolumes[0].name=v,extraVolumes[0].emptyDir.medium=Memory"


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def statefulsets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role ('master' / 'worker', from the name suffix the launcher relies on) -> StatefulSet."""
    sets = by_kind(objects, "StatefulSet")
    roles = {s["metadata"]["name"].rsplit("-", 1)[1]: s for s in sets}
    assert sorted(roles) == ["master", "worker"], [s["metadata"]["name"] for s in sets]
    return roles


def workload(objects: list[dict[str, Any]]) -> str:
    """`jobset` or `statefulset`: which one the render holds (never both, never neither)."""
    kinds = {o["kind"] for o in objects} & {"JobSet", "StatefulSet"}
    assert len(kinds) == 1, f"expected a JobSet or StatefulSets, got {kinds or 'neither'}"
    return kinds.pop().lower()


def replicated_jobs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role ('master' / 'worker') -> the JobSet's replicated job."""
    jobset = one(objects, "JobSet")
    rjobs = {REPLICATED_JOBS[r["name"]]: r for r in jobset["spec"]["replicatedJobs"]}
    assert len(rjobs) == len(jobset["spec"]["replicatedJobs"]), "two replicated jobs of one role"
    return rjobs


def pod_templates(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role -> the pod template (metadata + spec) of the StatefulSet or of the JobSet's Job."""
    if workload(objects) == "jobset":
        return {role: r["template"]["spec"]["template"] for role, r in replicated_jobs(objects).items()}
    return {role: s["spec"]["template"] for role, s in statefulsets(objects).items()}


def expected_workload(values: dict[str, Any], jobset_api: bool) -> str:
    if values["workload"] == "auto":
        return "jobset" if jobset_api else "statefulset"
    return values["workload"]


def helm_test_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = [o for o in by_kind(objects, "Pod") if o["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    return pod


def pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod spec: the training pods' templates and the helm test pod."""
    return [t["spec"] for t in pod_templates(objects).values()] + [helm_test_pod(objects)["spec"]]


def trainer(template: dict[str, Any]) -> dict[str, Any]:
    """The trainer container of a pod template."""
    (container,) = template["spec"]["containers"]
    return container


def topology_text(objects: list[dict[str, Any]]) -> str:
    """The topology file the chart's ConfigMap holds (what the pods mount and the launcher reads)."""
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-topology")]
    return cm["data"]["topology.yaml"]


def topology_of(objects: list[dict[str, Any]]):
    # The launcher's own parser: the chart's ConfigMap is a topology the launcher accepts.
    return parse_topology(yaml.safe_load(topology_text(objects)), "configmap")


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics (matchLabels + In/NotIn/Exists/DoesNotExist)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, vals = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in vals,
            "NotIn": key not in labels or labels[key] not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pod_labels(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """role -> the labels of its pods, with what the JobSet and Job controllers add to a JobSet's."""
    labels = {role: dict(t["metadata"]["labels"]) for role, t in pod_templates(objects).items()}
    if workload(objects) == "jobset":
        name = one(objects, "JobSet")["metadata"]["name"]
        for role, rjob in replicated_jobs(objects).items():
            labels[role] |= {
                contract.JOBSET_NAME_LABEL: name,
                contract.REPLICATED_JOB_LABEL: rjob["name"],
                contract.JOB_INDEX_LABEL: "0",
                "batch.kubernetes.io/job-name": f"{name}-{rjob['name']}-0",
            }
    labels["test"] = helm_test_pod(objects)["metadata"]["labels"]
    return labels


def jobset_cases() -> list[tuple[str, bool]]:
    """Every render that holds a JobSet: every scenario for a cluster with the JobSet API, plus
    the scenarios that ask for one (workload: jobset) on a cluster without it."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["workload"]
    own = {s: (yaml.safe_load(p.read_text()) if p else {}).get("workload", defaults) for s, p in SCENARIOS.items()}
    own = {s: w for s, w in own.items() if s in SCENARIO_NAMES}
    return [(s, api) for s, api in CASES if api or own[s] == "jobset"]


JOBSET_CASES = jobset_cases()
JOBSET_CASE_IDS = [f"{s}+jobset-api" if api else s for s, api in JOBSET_CASES]


def gpu_resource(objects: list[dict[str, Any]]) -> str:
    """The GPU resource name the pods request (the chart's gpuResourceName), nvidia.com/gpu if none."""
    for template in pod_templates(objects).values():
        for key in trainer(template).get("resources", {}).get("limits", {}):
            if key not in ("cpu", "memory"):
                return key
    return GPU
