"""The Job controller's part, for an Indexed Job whose pods never restart in place (restartPolicy
Never): what it keeps of each pod (its exit, and conditions such as DisruptionTarget that a
disruption put on it), what it adds to them, and its verdict on the Job.

* A pod ends when its container exits: 0 succeeded, anything else failed.
* A Job fails with reason PodFailurePolicy and the controller's message when a failed pod matches a
  podFailurePolicy FailJob rule (failure_rules.py: the rules in order, the first match decides;
  earliest failed pod first), else with BackoffLimitExceeded once more pods that no rule exempts
  failed than backoffLimit; it is Complete when every completion index succeeded.
* Otherwise each failed pod is replaced under its completion index (`to_replace`): at once when an
  Ignore rule matched it, after the Job controller's back-off when it counted (10 s, doubling, at most
  six minutes). A replacement starts once the old container has exited (podReplacementPolicy Failed).
  The pods a Job replaced stay in `replaced`: their failures keep counting.
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
    PodFailureVerdict,
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


# The Job controller's pod back-off: 10 s after the first counted failure, doubling, at most 6 minutes.
BACKOFF_S, BACKOFF_MAX_S = 10.0, 360.0


@dataclass
class Job:
    name: str
    replicated_job: str
    index: int
    pods: list[Pod]  # the current pod of each completion index
    condition: str | None = None  # Complete | Failed
    reason: str = ""
    message: str = ""
    failed_by: Pod | None = None  # the pod whose exit decided the failure
    replaced: list[Pod] = field(default_factory=list)  # failed pods this Job replaced, oldest first

    @property
    def complete(self) -> bool:
        return all(p.exit_code == 0 for p in self.pods)

    @property
    def failed_at(self) -> datetime | None:
        """What orders the failed Jobs: the deciding pod's exit."""
        return self.failed_by.finished_at if self.failed_by is not None else None


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


def _verdict(pod: Pod, rjob: ReplicatedJob, namespace: str) -> PodFailureVerdict:
    (container,) = rjob.pod_template["spec"]["containers"]
    status = FailedPod(namespace, pod.spec.name, container["name"], pod.exit_code, tuple(pod.conditions))
    return match_pod_failure_policy(rjob.pod_failure_rules, status)


def job_failure(job: Job, rjob: ReplicatedJob, namespace: str) -> JobFailure | None:
    """The Job's failure, if its pods' exits (those it replaced included) fail it now."""
    failed = [p for p in [*job.replaced, *job.pods] if p.exit_code not in (None, 0)]
    counted = []
    for pod in sorted(failed, key=lambda p: p.finished_at):
        verdict = _verdict(pod, rjob, namespace)
        if verdict.action == "FailJob":
            return JobFailure(POD_FAILURE_POLICY, verdict.message, pod)
        if verdict.counts:
            counted.append(pod)
    if len(counted) > rjob.backoff_limit:
        return JobFailure(BACKOFF_LIMIT_EXCEEDED, BACKOFF_LIMIT_MESSAGE, counted[-1])
    return None


def to_replace(job: Job, rjob: ReplicatedJob, namespace: str, now: datetime, backoff_s: float = BACKOFF_S) -> list[Pod]:
    """The current pods of a Job that has not failed whose replacement is due at `now`: an ignored
    failure at once, a counted one after the back-off of the counted failures so far (`backoff_s`
    doubling, at most BACKOFF_MAX_S)."""
    due = []
    counted = sum(_verdict(p, rjob, namespace).counts for p in job.replaced)
    for pod in job.pods:
        if pod.exit_code in (None, 0):
            continue
        if not _verdict(pod, rjob, namespace).counts:
            due.append(pod)
            continue
        counted += 1
        delay = min(backoff_s * 2 ** (counted - 1), BACKOFF_MAX_S)
        if pod.finished_at is None or (now - pod.finished_at).total_seconds() >= delay:
            due.append(pod)
    return due
