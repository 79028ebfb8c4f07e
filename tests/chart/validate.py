"""Validation of rendered objects as the cluster would do it: the Kubernetes 1.34 schemas (the
library behind `kubernetes-validate --strict`: unknown fields refused), the published JobSet v0.12.0
CRD's schema (schemas/, made strict by conftest.jobset_schema), and the JobSet webhook's name rules
the CRD cannot carry."""

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
