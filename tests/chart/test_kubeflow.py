"""The Kubeflow Trainer v2 form (kubeflowTrainer.runtime/trainJob): the training runtime (both kinds), its
TrainJob and the TrainJob's NetworkPolicy, validated against the published Trainer v2.3.0 CRDs (schemas/,
unknown fields refused) and the runtime's JobSet template against the JobSet v0.12.0 CRD; the runtime's
pod is the chart's own; exit code 2 fails it as the chart's JobSet does; the launcher in a TrainJob's
pod, given what Trainer's torch plugin injects, derives its node; the plain manifests in k8s/kubeflow/.

What Trainer's controller does with them is kubeflow/trainer v2.3.0's pkg/runtime/framework/plugins:
jobset (the JobSet is named after the TrainJob; the TrainJob's image, args, env and resourcesPerNode
replace the `node` container's), torch (PET_* into the container named `node` of the replicated job
labelled trainer.kubeflow.org/trainjob-ancestor-step=trainer). No Trainer controller runs here.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from maskrcnn_launcher import contract

from .conftest import CHART, RELEASE, ROOT, SCENARIOS, TRAINER_CRDS, published_schema, values_args
from .launch import launcher_command, pod_environment, write_topology
from .objects import KUBEFLOW_SCENARIOS, by_kind, one, selects, topology_of, trainer
from .validate import trainer_rule_problems, validate_jobset, validate_kubernetes_objects, validate_trainer

pytestmark = pytest.mark.needs_helm

KIND_TRAINING_RUNTIME = "kubeflowTrainer.runtime.kind=TrainingRuntime"
# (scenario, --set items): the ci scenario in both runtime kinds, and the defaults as k8s/kubeflow/ has them.
MANIFESTS_SETS = (
    "engine=ddp",
    "storage.accessModes={ReadWriteMany}",
    "kubeflowTrainer.runtime.enabled=true",
    "kubeflowTrainer.trainJob.enabled=true",
)
CASES = [(s, ()) for s in KUBEFLOW_SCENARIOS] + [(s, (KIND_TRAINING_RUNTIME,)) for s in KUBEFLOW_SCENARIOS]
CASES.append(("default", MANIFESTS_SETS))
CASE_IDS = [f"{s}{'+' + ','.join(sets) if sets else ''}"[:60] for s, sets in CASES]
ANCESTOR = {contract.TRAINJOB_ANCESTOR_LABEL: contract.TRAINJOB_ANCESTOR_TRAINER}


def runtime_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (runtime,) = [o for o in objects if o["kind"] in ("TrainingRuntime", "ClusterTrainingRuntime")]
    return runtime


def node_job(runtime: dict[str, Any]) -> dict[str, Any]:
    """The runtime's replicated job Trainer's torch plugin fills: `node`, labelled as the trainer's."""
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == contract.TRAINER_NODE
    assert rjob["template"]["metadata"]["labels"].items() >= ANCESTOR.items()
    return rjob


def node_pod(runtime: dict[str, Any]) -> dict[str, Any]:
    return node_job(runtime)["template"]["spec"]["template"]


def as_jobset(runtime: dict[str, Any], trainjob: dict[str, Any]) -> dict[str, Any]:
    """The JobSet Trainer makes of the runtime's template for `trainjob` (plugins/jobset Build): the
    TrainJob's name, its numNodes as the trainer job's parallelism and completions, one replica."""
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    for rjob in spec["replicatedJobs"]:
        if rjob["template"]["metadata"]["labels"].items() >= ANCESTOR.items():
            nodes = trainjob["spec"]["trainer"]["numNodes"]
            rjob["replicas"] = 1
            rjob["template"]["spec"] |= {"parallelism": nodes, "completions": nodes}
    name = trainjob["metadata"]["name"]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name}, "spec": spec}


def test_kubeflow_scenarios_exist() -> None:
    assert KUBEFLOW_SCENARIOS == ["kubeflow"], KUBEFLOW_SCENARIOS


def test_the_trainer_crds_are_the_published_v2_3_0() -> None:
    for kind, path in TRAINER_CRDS.items():
        crd = published_schema(path)
        assert crd["spec"]["names"]["kind"] == kind and crd["spec"]["group"] == "trainer.kubeflow.org"
        assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha1"]
        assert crd["spec"]["scope"] == ("Cluster" if kind == "ClusterTrainingRuntime" else "Namespaced")


@pytest.mark.parametrize(("scenario", "sets"), CASES, ids=CASE_IDS)
def test_everything_validates_against_the_published_schemas(
    render, trainer_schemas, jobset_schema, scenario: str, sets: tuple[str, ...]
) -> None:
    objects = render(scenario, *sets)
    assert {o["kind"] for o in objects} & {"StatefulSet", "JobSet", "Service", "Pod"} == set()
    runtime, trainjob = runtime_of(objects), one(objects, "TrainJob")
    assert runtime["kind"] == ("TrainingRuntime" if KIND_TRAINING_RUNTIME in sets else "ClusterTrainingRuntime")
    for obj in (runtime, trainjob):
        validate_trainer(obj, trainer_schemas[obj["kind"]])
    validate_jobset(as_jobset(runtime, trainjob), jobset_schema)
    validate_kubernetes_objects(objects)


def test_unknown_fields_are_refused(render, trainer_schemas) -> None:
    """The validation is as strict as the API server's pruning: a misspelt field is an error, not dropped."""
    runtime = copy.deepcopy(runtime_of(render("kubeflow")))
    runtime["spec"]["mlPolicy"]["torch"]["numProcPerNode"] = "auto"  # v2.3.0's torch policy has no such field
    with pytest.raises(AssertionError, match="numProcPerNode"):
        validate_trainer(runtime, trainer_schemas["ClusterTrainingRuntime"])
    trainjob = copy.deepcopy(one(render("kubeflow"), "TrainJob"))
    trainjob["spec"]["trainer"]["numProcPerNodes"] = 2
    with pytest.raises(AssertionError, match="numProcPerNodes"):
        validate_trainer(trainjob, trainer_schemas["TrainJob"])
    trainjob["metadata"]["name"] = "Coco"
    assert trainer_rule_problems(trainjob) == ["metadata.name 'Coco' is not an RFC 1035 label of at most 63 characters"]


def test_the_runtimes_pod_is_the_charts_own(render) -> None:
    """Same image, security contexts, /dev/shm, scratch, topology and data volumes, GPU resources and
    scheduling as the chart's ddp worker; only what a TrainJob's node needs differs."""
    objects = render("kubeflow")
    own = render("kubeflow", "kubeflowTrainer.runtime.enabled=false", "kubeflowTrainer.trainJob.enabled=false")
    node = node_pod(runtime_of(objects))
    (worker,) = [
        s["spec"]["template"] for s in by_kind(own, "StatefulSet") if s["metadata"]["name"].endswith("-worker")
    ]
    same_spec = ("securityContext", "tolerations", "terminationGracePeriodSeconds", "automountServiceAccountToken")
    assert {k: node["spec"].get(k) for k in same_spec} == {k: worker["spec"].get(k) for k in same_spec}
    read_write = [
        {**v, "persistentVolumeClaim": {**v["persistentVolumeClaim"], "readOnly": False}}
        if "persistentVolumeClaim" in v
        else v
        for v in worker["spec"]["volumes"]
    ]
    assert node["spec"]["volumes"] == read_write  # node 0 writes the run: the claim is mounted read-write
    assert node["spec"]["restartPolicy"] == "Never"
    container, chart_container = trainer(node), trainer(worker)
    for key in ("image", "imagePullPolicy", "resources", "securityContext"):
        assert container[key] == chart_container[key], key
    assert [m["mountPath"] for m in container["volumeMounts"]] == [
        m["mountPath"] for m in chart_container["volumeMounts"]
    ]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert container["name"] == contract.TRAINER_NODE  # the container Trainer's plugins fill
    assert container["command"] == [
        "dumb-init",
        "--",
        "maskrcnn-launch",
        "launch",
        "--topology",
        "$(MASKRCNN_TOPOLOGY)",
        "--",
    ]
    assert container["args"] == chart_container["args"][4:]  # the trainer's: a TrainJob's args replace them
    names = tuple(e["name"] for e in container["env"])
    assert names == contract.TRAINJOB_POD_ENV_VARS + contract.TRAINER_READ_VARS
    assert "ports" not in container  # Trainer adds its port 29500 itself
    assert node["metadata"]["labels"]["app.kubernetes.io/component"] == "node"


def test_the_trainjob_fails_and_restarts_as_the_charts_jobset_does(render) -> None:
    """The runtime's JobSet template takes _failure_policy.tpl's rules, with its container `node`:
    the same rules (user error, disruption, clean stop), the same messages matched."""
    runtime = runtime_of(render("kubeflow"))
    jobset = one(
        render(
            "kubeflow",
            "kubeflowTrainer.runtime.enabled=false",
            "kubeflowTrainer.trainJob.enabled=false",
            "workload=jobset",
        ),
        "JobSet",
    )

    def as_node(obj: object) -> object:  # the chart's rules, written for the container `node`
        text = json.dumps(obj).replace('"containerName": "trainer"', '"containerName": "node"')
        return json.loads(text.replace("^Container trainer for pod", "^Container node for pod"))

    template = runtime["spec"]["template"]["spec"]
    assert template["failurePolicy"] == as_node(jobset["spec"]["failurePolicy"])
    assert [r["name"] for r in template["failurePolicy"]["rules"]] == ["UserError", "Disruption", "StoppedCleanly"]
    job = node_job(runtime)["template"]["spec"]
    for rjob in jobset["spec"]["replicatedJobs"]:
        chart_job = rjob["template"]["spec"]
        assert job["backoffLimit"] == chart_job["backoffLimit"] == 0
        assert job["podFailurePolicy"] == as_node(chart_job["podFailurePolicy"])
    codes = [r["onExitCodes"] for r in job["podFailurePolicy"]["rules"] if "onExitCodes" in r]
    assert [c["containerName"] for c in codes] == ["node", "node"]
    assert [c["values"] for c in codes] == [[contract.EXIT_USER_ERROR], [contract.EXIT_STOPPED]]
    assert job["completionMode"] == "Indexed" and template["network"]["enableDNSHostnames"] is True
    assert "subdomain" not in template["network"]  # the TrainJob's name, as PET_MASTER_ADDR says


def trainjob_pod_labels(objects: list[dict[str, Any]], trainjob: str) -> dict[str, str]:
    """A TrainJob's pod's labels: the runtime's template and the JobSet controller's (the JobSet is
    named after the TrainJob)."""
    labels = dict(node_pod(runtime_of(objects))["metadata"]["labels"])
    return labels | {contract.JOBSET_NAME_LABEL: trainjob, contract.REPLICATED_JOB_LABEL: contract.TRAINER_NODE}


def test_the_networkpolicy_admits_the_rendezvous_port_only_from_the_jobs_own_pods(render) -> None:
    objects = render("kubeflow")
    (policy,) = by_kind(objects, "NetworkPolicy")
    name = one(objects, "TrainJob")["metadata"]["name"]
    assert name == "coco-ddp" and policy["metadata"]["name"] == "coco-ddp-peers"
    own, other = trainjob_pod_labels(objects, name), trainjob_pod_labels(objects, "another-job")
    assert selects(policy["spec"]["podSelector"], own) and not selects(policy["spec"]["podSelector"], other)
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector: this namespace only
    assert selects(peer["podSelector"], own) and not selects(peer["podSelector"], other)
    assert rule["ports"][0] == {"protocol": "TCP", "port": contract.TRAINER_MASTER_PORT}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert by_kind(render("kubeflow", "networkPolicy.enabled=false"), "NetworkPolicy") == []


def test_the_trainjob_asks_for_the_topologys_shape(render) -> None:
    objects = render("kubeflow")
    topology, runtime, trainjob = topology_of(objects), runtime_of(objects), one(objects, "TrainJob")
    spec = trainjob["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": runtime["kind"],
        "name": runtime["metadata"]["name"],
    }
    assert spec["trainer"]["numNodes"] == runtime["spec"]["mlPolicy"]["numNodes"] == topology.nnodes == 2
    assert spec["trainer"]["numProcPerNode"] == max(topology.master_devices, 1) == 2
    assert spec["trainer"]["resourcesPerNode"] == trainer(node_pod(runtime))["resources"]
    assert spec["trainer"]["args"] == trainer(node_pod(runtime))["args"]
    assert runtime["spec"]["mlPolicy"]["torch"] == {}


def injected_env(trainjob: dict[str, Any], node: int) -> dict[str, str]:
    """What Trainer's torch plugin adds to the node container (torch.go EnforceMLPolicy): numProcPerNode
    as given (an int in v2.3.0's TrainJob), the completion index through the downward API."""
    name, spec = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]
    return {
        contract.PET_NNODES: str(spec["numNodes"]),
        contract.PET_NPROC_PER_NODE: str(spec.get("numProcPerNode", "auto")),
        contract.PET_NODE_RANK: str(node),
        contract.PET_MASTER_ADDR: contract.trainjob_master_addr(name),
        contract.PET_MASTER_PORT: str(contract.TRAINER_MASTER_PORT),
    }


@pytest.mark.slow
@pytest.mark.parametrize("node", [0, 1])
def test_the_launcher_in_a_trainjob_pod_derives_its_node(render, tmp_path: Path, node: int) -> None:
    objects = render("kubeflow")
    trainjob = one(objects, "TrainJob")
    container = trainer(node_pod(runtime_of(objects)))
    pod = f"coco-ddp-node-0-{node}-x7k2p"
    env = pod_environment(container, pod, f"10.0.0.{node}", write_topology(objects, tmp_path), hostname=pod[:-6])
    env |= injected_env(trainjob, node)
    launcher = container["command"][container["command"].index("launch") :]
    launcher = [env["MASKRCNN_TOPOLOGY"] if a == "$(MASKRCNN_TOPOLOGY)" else a for a in launcher]
    proc = subprocess.run(
        [*launcher_command(), launcher[0], "--dry-run", *launcher[1:], *spec_args(trainjob)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    argv = out["argv"]
    flags = {argv[i]: argv[i + 1] for i in range(3, 13, 2)}
    assert flags == {
        "--nnodes": "2",
        "--node-rank": str(node),
        "--nproc-per-node": "2",
        "--master-addr": "coco-ddp-node-0-0.coco-ddp",
        "--master-port": "29500",
    }
    assert argv[argv.index("--engine") + 2 :] == spec_args(trainjob)
    assert out["identity_source"] == f"Kubeflow Trainer torch runtime: PET_NODE_RANK={node} of PET_NNODES=2"
    assert out["pod"]["dns_name"] == f"coco-ddp-node-0-{node}.coco-ddp.default.svc.cluster.local"


def spec_args(trainjob: dict[str, Any]) -> list[str]:
    return list(trainjob["spec"]["trainer"]["args"])


REFUSALS = [
    (("engine=pipeline", "master.gpus=0", "worker.gpus=0"), "kubeflowTrainer.runtime.enabled needs engine=ddp"),
    (("master.gpus=1",), "master.gpus (1) and worker.gpus (2) differ"),
    (("network.masterPort=29400",), "Kubeflow Trainer fixes the rendezvous port at 29500"),
    (
        ("kubeflowTrainer.runtime.enabled=false",),
        "kubeflowTrainer.trainJob.enabled needs kubeflowTrainer.runtime.enabled",
    ),
    (("kubeflowTrainer.trainJob.name=" + "j" * 50,), "must be a DNS-1035 label short enough for its pods' names"),
    (("kubeflowTrainer.runtime.kind=TrainJob",), "/kubeflowTrainer/runtime/kind"),
    (("kubeflowTrainer.trainJob.name=Coco",), "/kubeflowTrainer/trainJob/name"),
]


@pytest.mark.parametrize(("sets", "message"), REFUSALS, ids=[r[1][:40] for r in REFUSALS])
def test_refusals(run_helm, sets: tuple[str, ...], message: str) -> None:
    proc = run_helm("template", RELEASE, str(CHART), *values_args(SCENARIOS["kubeflow"], sets))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("sets", [(), (KIND_TRAINING_RUNTIME,), ("kubeflowTrainer.trainJob.enabled=false",)])
def test_helm_lint(run_helm, sets: tuple[str, ...]) -> None:
    proc = run_helm("lint", "--strict", str(CHART), *values_args(SCENARIOS["kubeflow"], sets))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_k8s_kubeflow_holds_a_valid_runtime_and_trainjob(trainer_schemas, jobset_schema) -> None:
    """The plain manifests (make manifests; test_manifests.py keeps them in sync with the chart)."""
    folder = ROOT / "k8s" / "kubeflow"
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    objects = [obj for name in kustomization["resources"] for obj in yaml.safe_load_all((folder / name).read_text())]
    assert sorted(o["kind"] for o in objects) == [
        "ClusterTrainingRuntime",
        "ConfigMap",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "TrainJob",
    ]
    runtime, trainjob = runtime_of(objects), one(objects, "TrainJob")
    for obj in (runtime, trainjob):
        validate_trainer(obj, trainer_schemas[obj["kind"]])
    validate_jobset(as_jobset(runtime, trainjob), jobset_schema)
    validate_kubernetes_objects(objects)
    assert "--data-path" in trainjob["spec"]["trainer"]["args"]  # trains ddp from the claim the runtime mounts
    assert one(objects, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]
    assert trainjob["spec"]["trainer"]["numNodes"] == topology_of(objects).nnodes
