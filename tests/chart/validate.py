"""Validation of rendered objects as the cluster would do it: the Kubernetes 1.34 schemas (the
library behind `kubernetes-validate --strict`: unknown fields refused), the published JobSet v0.12.0
and Kubeflow Trainer v2.3.0 CRDs' schemas (schemas/, made strict by published_schemas.crd_schema), and
the JobSet webhook's name rules and the Trainer CRDs' creation rules (x-kubernetes-validations) that
jsonschema cannot carry."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

KUBERNETES_VERSION = "1.34.0"


def validate_kubernetes(obj: dict[str, Any], what: str) -> None:
    """The library behind `kubernetes-validate -k 1.34.0 --strict`: strict rejects unknown fields."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{what}: {exc.message} at {list(exc.path)}")


# Custom resources: their own fields are the CRD's (validate_jobset, validate_trainer); what they
# embed of Kubernetes is checked here.
TRAINER_KINDS = ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")


def validate_kubernetes_objects(objects: list[dict[str, Any]]) -> None:
    """Every object against the Kubernetes schemas; of a JobSet or a Kubeflow Trainer object, what its
    CRD leaves to Kubernetes."""
    for obj in objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind not in ("JobSet", *TRAINER_KINDS):
            validate_kubernetes(obj, f"{kind}/{name}")
            continue
        # What the CRD leaves to Kubernetes is checked against Kubernetes' schemas: the metadata
        # (ObjectMeta), each Job the JobSet controller will create from a replicated job's template (a
        # runtime's JobSet template), and a TrainJob's resourcesPerNode (ResourceRequirements).
        validate_kubernetes({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, f"{kind} metadata")
        spec = obj["spec"]["template"]["spec"] if kind in TRAINER_KINDS[1:] else obj["spec"]
        for rjob in spec.get("replicatedJobs", []):
            job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": rjob["name"]}, **rjob["template"]}
            validate_kubernetes(job, f"{kind} {name}, replicated job {rjob['name']}")
        if kind == "TrainJob" and "resourcesPerNode" in obj["spec"]["trainer"]:
            container = {"name": "node", "image": "x", "resources": obj["spec"]["trainer"]["resourcesPerNode"]}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container]}}
            validate_kubernetes(pod, f"TrainJob {name} resourcesPerNode")


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
    # Without a subdomain the JobSet controller uses the JobSet's name (a TrainJob's: Trainer leaves it).
    names = [("subdomain", spec.get("network", {}).get("subdomain", name))]
    for rjob in spec["replicatedJobs"]:
        job = f"{name}-{rjob['name']}-{rjob['replicas'] - 1}"
        pod = f"{job}-{rjob['template']['spec']['completions'] - 1}{POD_NAME_SUFFIX}"
        names += [("Job", job), ("pod", pod)]
    return [f"{what} {n!r}" for what, n in names if not (DNS_1035_LABEL.match(n) and len(n) <= 63)]


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
    assert set(spec.get("successPolicy", {}).get("targetReplicatedJobs", [])) <= set(names)
    assert not jobset_name_problems(jobset)


def trainer_rule_problems(obj: dict[str, Any]) -> list[str]:
    """The Trainer v2.3.0 CRDs' x-kubernetes-validations that apply when an object is created (the
    others compare with the old object): a TrainJob's name is an RFC 1035 label of at most 63
    characters; a runtime names one ML policy at most, and no InOrder startup with dependsOn."""
    problems = []
    if obj["kind"] == "TrainJob":
        name = obj["metadata"]["name"]
        if not (DNS_1035_LABEL.match(name) and len(name) <= 63):
            problems.append(f"metadata.name {name!r} is not an RFC 1035 label of at most 63 characters")
        return problems
    policies = [p for p in ("torch", "mpi", "jax", "xgboost", "flux") if p in obj["spec"].get("mlPolicy", {})]
    if len(policies) > 1:
        problems.append(f"mlPolicy names {policies}: only one of the policies can be configured")
    spec = obj["spec"]["template"]["spec"]
    in_order = spec.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder"
    if in_order and any("dependsOn" in r for r in spec["replicatedJobs"]):
        problems.append("startupPolicy InOrder with dependsOn")
    return problems


def validate_trainer(obj: dict[str, Any], schema: dict[str, Any]) -> None:
    """What an API server with Kubeflow Trainer v2.3 checks: jsonschema over the kind's CRD schema
    (unknown fields refused) and the creation rules jsonschema cannot carry."""
    assert obj["apiVersion"] == "trainer.kubeflow.org/v1alpha1", obj["apiVersion"]
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    assert not trainer_rule_problems(obj), trainer_rule_problems(obj)
