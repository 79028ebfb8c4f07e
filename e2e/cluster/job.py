"""The Job controller's part, for an Indexed Job whose pods never restart in place (restartPolicy
Never): what it keeps of each pod (its exit, and conditions such as DisruptionTarget that a
disruption put on it), what it adds to them, and its verdict on the Job.

* A pod ends when its container exits: 0 succeeded, anything else failed.
* A Job fails with reason PodFailurePolicy and the controller's message when a failed pod matches a
  podFailurePolicy FailJob rule (failure_rules.py: the rules in order, the first match decides;
  earliest failed pod first), else with BackoffLimitExceeded once more pods that no rule exempts
  failed than backoffLimit; it is Complete when every completion index succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from .docker import ContainerState
from .failure_rules import (
    BACKOFF_LIMIT_EXCEEDED,
    BACKOFF_LIMIT_MESSAGE,
    POD_FAILURE_POLICY,
    FailedPod,
    PodCondition,
    match_pod_failure_policy,
)
from .jobset_spec import ReplicatedJob
from .pods import PodSpec

# What the Job controller adds to an Indexed Job's pods.
JOB_NAME = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"


class ContainerStates(Protocol):
    def state(self, name: str) -> ContainerState: ...


@dataclass
class Pod:
    spec: PodSpec
    container: str
    index: int  # completion index
    exit_code: int | None = None  # once the container has exited
    finished_at: datetime | None = None
    conditions: list[PodCondition] = field(default_factory=list)  # the ones a disruption adds

    def record_exit(self, state: ContainerState) -> None:
        self.exit_code, self.finished_at = state.exit_code, state.finished_time


@dataclass
class Job:
    name: str
    replicated_job: str
    index: int
    pods: list[Pod]
    condition: str | None = None  # Complete | Failed
    reason: str = ""
    message: str = ""
    failed_at: datetime | None = None

    @property
    def complete(self) -> bool:
        return all(p.exit_code == 0 for p in self.pods)


@dataclass(frozen=True)
class JobFailure:
    """Why the Job controller fails a Job, and the pod whose exit decided it."""

    reason: str
    message: str
    pod: Pod


def observe_exits(job: Job, cluster: ContainerStates) -> None:
    """Record the exit of each pod whose container has exited since the last look."""
    for pod in job.pods:
        if pod.exit_code is None:
            state = cluster.state(pod.container)
            if state.status == "exited":
                pod.record_exit(state)


def job_failure(job: Job, rjob: ReplicatedJob, namespace: str) -> JobFailure | None:
    """The Job's failure, if its pods' exits fail it now."""
    failures = sorted((p for p in job.pods if p.exit_code not in (None, 0)), key=lambda p: p.finished_at)
    (container,) = rjob.pod_template["spec"]["containers"]
    counted = []
    for pod in failures:
        status = FailedPod(namespace, pod.spec.name, container["name"], pod.exit_code, tuple(pod.conditions))
        verdict = match_pod_failure_policy(rjob.pod_failure_rules, status)
        if verdict.action == "FailJob":
            return JobFailure(POD_FAILURE_POLICY, verdict.message, pod)
        if verdict.counts:
            counted.append(pod)
    if len(counted) > rjob.backoff_limit:
        return JobFailure(BACKOFF_LIMIT_EXCEEDED, BACKOFF_LIMIT_MESSAGE, counted[-1])
    return None
