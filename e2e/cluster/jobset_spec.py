"""The parts of a rendered JobSet (jobset.x-k8s.io/v1alpha2, kubernetes-sigs/jobset v0.12) that the
emulated controllers act on: its replicated Jobs with their podFailurePolicy rules, and its failure
policy's rules (both parsed by failure_rules.py).

What the chart does not use is refused here (SpecError) rather than ignored: startupPolicy InOrder,
dependsOn, coordinator, suspend, managedBy, volumeClaimPolicies, failure policy actions other than
FailJobSet / RestartJobSet / RestartJobSetAndIgnoreMaxRestarts, a message pattern that does not
compile, Jobs that are not Indexed or whose parallelism differs from completions, restartPolicy other
than Never, and podFailurePolicy rules with the action FailIndex.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .failure_rules import FailureRule, PodFailureRule, parse_failure_rules, parse_pod_failure_rules
from .pods import SpecError

API_VERSION = "jobset.x-k8s.io/v1alpha2"


@dataclass(frozen=True)
class ReplicatedJob:
    name: str
    replicas: int
    completions: int
    backoff_limit: int
    pod_failure_rules: tuple[PodFailureRule, ...]
    pod_template: dict[str, Any]


@dataclass(frozen=True)
class JobSetSpec:
    name: str
    namespace: str
    subdomain: str
    success_operator: str
    success_targets: tuple[str, ...]
    max_restarts: int
    restart_strategy: str
    rules: tuple[FailureRule, ...]
    replicated_jobs: tuple[ReplicatedJob, ...]
    ttl_seconds_after_finished: int | None = None


def find_jobset(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [o for o in objects if o.get("kind") == "JobSet"]
    if len(found) > 1:
        raise SpecError(f"{len(found)} JobSets rendered; the harness runs one")
    return found[0] if found else None


def parse_jobset(obj: dict[str, Any], namespace: str) -> JobSetSpec:
    """The parts of a rendered JobSet the emulation acts on; SpecError for what it does not emulate."""
    if obj.get("apiVersion") != API_VERSION:
        raise SpecError(f"JobSet apiVersion {obj.get('apiVersion')!r}, the harness emulates {API_VERSION}")
    name, spec = obj["metadata"]["name"], obj["spec"]
    for unsupported in ("coordinator", "suspend", "managedBy", "volumeClaimPolicies"):
        if spec.get(unsupported):
            raise SpecError(f"JobSet {name}: spec.{unsupported} is not emulated by the e2e harness")
    if (spec.get("startupPolicy") or {}).get("startupPolicyOrder", "AnyOrder") != "AnyOrder":
        raise SpecError(f"JobSet {name}: startupPolicy InOrder is not emulated by the e2e harness")
    network = spec.get("network") or {}
    if not network.get("enableDNSHostnames"):
        raise SpecError(f"JobSet {name}: without network.enableDNSHostnames pods have no stable host names")
    success = spec.get("successPolicy") or {"operator": "All"}
    policy = spec.get("failurePolicy") or {}
    rules = parse_failure_rules(f"JobSet {name}", policy.get("rules"))
    rjobs = tuple(_replicated_job(name, r) for r in spec["replicatedJobs"])
    return JobSetSpec(
        name=name,
        namespace=namespace,
        subdomain=network.get("subdomain") or name,
        success_operator=success.get("operator", "All"),
        success_targets=tuple(success.get("targetReplicatedJobs") or ()),
        # Without a failure policy any failed Job fails the JobSet: maxRestarts 0 does the same.
        max_restarts=int(policy.get("maxRestarts", 0)),
        restart_strategy=policy.get("restartStrategy", "Recreate"),
        rules=rules,
        replicated_jobs=rjobs,
        ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"),
    )


def _replicated_job(jobset: str, rjob: dict[str, Any]) -> ReplicatedJob:
    if rjob.get("dependsOn"):
        raise SpecError(f"JobSet {jobset}: replicated job {rjob['name']}: dependsOn is not emulated")
    job = rjob["template"]["spec"]
    if job.get("completionMode", "Indexed") != "Indexed":
        raise SpecError(f"JobSet {jobset}: replicated job {rjob['name']} is not an Indexed Job")
    completions = int(job.get("completions", 1))
    if int(job.get("parallelism", completions)) != completions:
        raise SpecError(f"JobSet {jobset}: replicated job {rjob['name']}: parallelism != completions is not emulated")
    if job["template"]["spec"].get("restartPolicy") != "Never":
        raise SpecError(f"JobSet {jobset}: replicated job {rjob['name']}: only restartPolicy Never is emulated")
    pod_rules = parse_pod_failure_rules(f"JobSet {jobset}: replicated job {rjob['name']}", job.get("podFailurePolicy"))
    return ReplicatedJob(
        name=rjob["name"],
        replicas=int(rjob.get("replicas", 1)),
        completions=completions,
        backoff_limit=int(job.get("backoffLimit", 6)),
        pod_failure_rules=pod_rules,
        pod_template=job["template"],
    )
