"""Kubeflow Trainer v2's controller, the part that turns a TrainJob into a JobSet, emulated: from the
rendered TrainJob and the training runtime it names, the JobSet (and objects beside it) that the
controller would create; jobset.py's controller then runs it. No Trainer controller or API server
runs here, so this does what kubeflow/trainer v2.3.0's runtime plugins do to the runtime's JobSet
template, and nothing else (pkg/runtime/framework/plugins):

* jobset (jobset.go Build, builder.go Trainer): the JobSet is named after the TrainJob (so is its
  subdomain, when the template names none); the replicated job labelled
  trainer.kubeflow.org/trainjob-ancestor-step=trainer gets 1 replica and numNodes (the TrainJob's, else
  the runtime's mlPolicy.numNodes) as its Job's parallelism and completions; in its `node` container
  the TrainJob's image, command, args and resourcesPerNode replace the template's, its env is upserted.
* torch (torch.go EnforceMLPolicy): PET_NNODES, PET_NPROC_PER_NODE (numProcPerNode; without it `auto`
  when resourcesPerNode asks for a GPU, else the CPU count), PET_NODE_RANK (the downward API over the
  completion index annotation), PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>`, PET_MASTER_PORT 29500,
  upserted into the `node` container, and its container port 29500.
* trainjobstatus (TrainJobStatus feature gate): KUBEFLOW_TRAINER_SERVER_URL (the status server's
  `/apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`),
  KUBEFLOW_TRAINER_SERVER_CA_CERT and KUBEFLOW_TRAINER_SERVER_TOKEN (files under
  /var/run/secrets/kubeflow/trainer, the volume kubeflow-trainer-token) in the trainer's containers.

What it does otherwise (a ConfigMap for the token volume, no status written back, what is refused) is
listed in README.md beside this file.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from .pods import SpecError

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
NODE = "node"  # constants.Node: the trainer's replicated job and container
TRAINER_PORT = 29500  # constants.ContainerTrainerPort
COMPLETION_INDEX_PATH = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
STATUS_MOUNT = "/var/run/secrets/kubeflow/trainer"
STATUS_VOLUME = "kubeflow-trainer-token"
# TrainJob fields the emulation does not act on: refused rather than ignored.
UNEMULATED = ("initializer", "runtimePatches", "podTemplateOverrides", "suspend", "managedBy")


@dataclass(frozen=True)
class StatusServer:
    """The controller's status server as the TrainJobStatus plugin announces it: its base URL
    (`https://<service>.<namespace>.svc:<port>`), the CA that signed its certificate, and the token a
    pod presents (a projected service-account token in a real cluster)."""

    base_url: str
    ca_pem: str
    token: str

    def url(self, namespace: str, trainjob: str) -> str:
        return f"{self.base_url}/apis/{TRAINER_API}/namespaces/{namespace}/trainjobs/{trainjob}/status"


def trainjob_objects(
    objects: list[dict[str, Any]], namespace: str, status: StatusServer | None
) -> list[dict[str, Any]]:
    """What Trainer's controller creates for the one TrainJob among `objects`: its JobSet, and with a
    status server the ConfigMap that stands in for the token volume."""
    trainjob = _only(objects, "TrainJob")
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"].get("trainer") or {}
    runtime = _runtime(objects, trainjob["spec"]["runtimeRef"])
    _refuse_unemulated(trainjob, runtime)
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    nodes = int(trainer.get("numNodes") or runtime["spec"]["mlPolicy"].get("numNodes") or 1)
    rjob = _trainer_job(spec, name)
    rjob["replicas"] = 1
    rjob["template"]["spec"] |= {"parallelism": nodes, "completions": nodes}
    pod = rjob["template"]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == NODE]
    _apply_trainer(container, trainer)
    _upsert_env(container, _torch_env(name, nodes, trainer))
    container["ports"] = [p for p in container.get("ports", []) if p.get("containerPort") != TRAINER_PORT]
    container["ports"].append({"containerPort": TRAINER_PORT})
    extra = [] if status is None else [_inject_status(pod, name, namespace, status)]
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name}, "spec": spec}
    return [jobset, *extra]


def _only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o.get("kind") == kind and o.get("apiVersion") == TRAINER_API]
    if len(found) != 1:
        raise SpecError(f"{len(found)} {kind}s rendered; the emulated Trainer controller runs one")
    return found[0]


def _runtime(objects: list[dict[str, Any]], ref: dict[str, Any]) -> dict[str, Any]:
    kind = ref.get("kind", "ClusterTrainingRuntime")
    for obj in objects:
        if obj.get("kind") == kind and obj["metadata"]["name"] == ref["name"]:
            return obj
    raise SpecError(f"the TrainJob's runtimeRef {kind}/{ref['name']} was not rendered")


def _refuse_unemulated(trainjob: dict[str, Any], runtime: dict[str, Any]) -> None:
    for field in UNEMULATED:
        if trainjob["spec"].get(field):
            raise SpecError(f"TrainJob spec.{field} is not emulated by the e2e harness")
    policies = set(runtime["spec"].get("mlPolicy") or {}) - {"numNodes"}
    if policies != {"torch"} or runtime["spec"]["mlPolicy"]["torch"]:
        raise SpecError(f"runtime mlPolicy {sorted(policies)}: only a plain torch policy is emulated")


def _trainer_job(spec: dict[str, Any], trainjob: str) -> dict[str, Any]:
    """The trainer's replicated job; the subdomain defaults to the TrainJob's name (JobSet's default)."""
    spec.setdefault("network", {}).setdefault("subdomain", trainjob)
    found = [
        r
        for r in spec["replicatedJobs"]
        if (r["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) == "trainer"
    ]
    if len(found) != 1 or len(spec["replicatedJobs"]) != 1:
        raise SpecError(
            "the runtime must hold exactly one replicated job, the trainer's: initializers are not emulated"
        )
    return found[0]


def _apply_trainer(container: dict[str, Any], trainer: dict[str, Any]) -> None:
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            container[key] = copy.deepcopy(trainer[key])
    resources = trainer.get("resourcesPerNode") or {}
    if resources.get("limits") or resources.get("requests"):
        container["resources"] = copy.deepcopy(resources)
    _upsert_env(container, copy.deepcopy(trainer.get("env") or []))


def _torch_env(trainjob: str, nodes: int, trainer: dict[str, Any]) -> list[dict[str, Any]]:
    nproc = trainer.get("numProcPerNode")
    if nproc is None:
        nproc = _default_nproc(trainer.get("resourcesPerNode") or {})
    return [
        {"name": "PET_NNODES", "value": str(nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_PATH}}},
        {"name": "PET_MASTER_ADDR", "value": f"{trainjob}-{NODE}-0-0.{trainjob}"},
        {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
    ]


def _default_nproc(resources: dict[str, Any]) -> str:
    """`auto` when resourcesPerNode asks for a GPU, else its CPU count (limit, else request; at least 1)."""
    sections = [resources.get("limits") or {}, resources.get("requests") or {}]
    if any("gpu" in name.lower() for section in sections for name in section):
        return "auto"
    cpu = next((str(s["cpu"]) for s in sections if "cpu" in s), "1")
    cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    return str(max(1, math.ceil(cores)))


def _inject_status(pod: dict[str, Any], trainjob: str, namespace: str, status: StatusServer) -> dict[str, Any]:
    """The TrainJobStatus plugin's variables and volume in every container of the trainer's pods. The
    volume is a ConfigMap here (a projected service-account token and a ConfigMap in a real cluster)."""
    env = [
        {"name": "KUBEFLOW_TRAINER_SERVER_URL", "value": status.url(namespace, trainjob)},
        {"name": "KUBEFLOW_TRAINER_SERVER_CA_CERT", "value": f"{STATUS_MOUNT}/ca.crt"},
        {"name": "KUBEFLOW_TRAINER_SERVER_TOKEN", "value": f"{STATUS_MOUNT}/token"},
    ]
    for container in pod["containers"]:
        _upsert_env(container, env)
        container.setdefault("volumeMounts", []).append(
            {"name": STATUS_VOLUME, "mountPath": STATUS_MOUNT, "readOnly": True}
        )
    configmap = f"{trainjob}-tls-config"
    pod.setdefault("volumes", []).append({"name": STATUS_VOLUME, "configMap": {"name": configmap}})
    data = {"ca.crt": status.ca_pem, "token": status.token}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap, "namespace": namespace},
        "data": data,
    }


def _upsert_env(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """apply.UpsertEnvVars: a variable of the same name is replaced in place, a new one appended."""
    current = container.setdefault("env", [])
    for item in env:
        at = next((i for i, e in enumerate(current) if e["name"] == item["name"]), None)
        if at is None:
            current.append(item)
        else:
            current[at] = item
