"""The JobSet controller (kubernetes-sigs/jobset v0.12), emulated over docker containers, from the
JobSet that the chart renders. No JobSet controller or API server can run here, so this module does
what their documentation (JobSet concepts, failure policy) and the JobSet controller's reconcile
loop say they do, and nothing else; the Job controller's part is job.py, the spec jobset_spec.py:

* Jobs and pods. Replicated job `r` makes `replicas` Jobs `<jobset>-<r>-<j>`; each is an Indexed Job
  of `completions` pods, all started at once (parallelism == completions). Pod `i` has the host name
  `<job>-<i>` under `spec.network.subdomain` (the headless Service: its DNS names become network
  aliases) and the name `<job>-<i>-<5 random characters>`, new on every restart. Every pod gets the
  labels and annotations the controllers add (jobset.sigs.k8s.io/jobset-name, replicatedjob-name,
  replicatedjob-replicas, job-index, restart-attempt; batch.kubernetes.io/job-name and
  job-completion-index) and the Job controller's JOB_COMPLETION_INDEX variable.
* The JobSet, in the controller's order. Failed Jobs first: the failure policy's rules in order,
  each taking the earliest failed Job whose reason (onJobFailureReasons), message
  (onJobFailureMessagePatterns) and replicated job (targetReplicatedJobs) it matches
  (failure_rules.py); no rule: RestartJobSet. FailJobSet: Failed (FailJobSetFailurePolicyAction).
  RestartJobSet: Failed (ReachedMaxRestarts) once restartsCountTowardsMax has reached maxRestarts,
  else restarts + 1, restartsCountTowardsMax + 1 and the whole group is recreated (every old pod is
  gone before a new one starts). RestartJobSetAndIgnoreMaxRestarts: the same restart, without
  checking or raising restartsCountTowardsMax. Then the success policy (operator All or Any over
  targetReplicatedJobs): Completed (AllJobsCompleted).
* A pod taken away (`delete_pod`): with a disruption reason, first the DisruptionTarget condition, as
  the scheduler's preemption, the eviction API, the taint manager, pod GC and the kubelet add it;
  then, as for `kubectl delete pod`, SIGTERM and SIGKILL after the pod's grace period
  (`docker stop --time`). Its Job then meets its podFailurePolicy like any failed pod.
* A failed pod that neither fails its Job (FailJob, backoffLimit) nor ends the group is replaced by
  the Job controller under its completion index (job.py `to_replace`: an Ignore rule at once, a
  counted failure after the back-off), with a new name, the same host name and the same attempt.
* A finished JobSet deletes its active Jobs: their pods get SIGTERM, then SIGKILL after
  terminationGracePeriodSeconds (`docker stop`). Nothing is created afterwards.

Where this differs from the real controllers (Recreate run as BlockingRecreate, no FailureTarget,
polling, what is not emulated) is listed in README.md beside this file.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .docker import Cluster, DockerError
from .failure_rules import DEFAULT_ACTION, DISRUPTION_REASONS, DISRUPTION_TARGET, PodCondition, acting_rule
from .job import (
    BACKOFF_S,
    COMPLETION_INDEX,
    COMPLETION_INDEX_ENV,
    JOB_NAME,
    Job,
    JobFailure,
    Pod,
    job_failure,
    observe_exits,
    to_replace,
)
from .jobset_spec import JobSetSpec, ReplicatedJob, find_jobset, parse_jobset
from .pods import PodSpec, SpecError, configmaps_of, pod_from_template

log = logging.getLogger("e2e")

# Labels and annotations (same keys) the JobSet controller puts on Jobs and their pods.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
# JobSet condition reasons, as the controller writes them.
FAIL_JOBSET_REASON = "FailJobSetFailurePolicyAction"
MAX_RESTARTS_REASON = "ReachedMaxRestarts"
COMPLETED_REASON = "AllJobsCompleted"
# Characters of the random suffix of generated names (k8s.io/apimachinery/pkg/util/rand).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True)
class Condition:
    type: str  # Completed | Failed
    reason: str
    message: str


@dataclass
class Attempt:
    """One run of the whole group: restart attempt `number`, its Jobs."""

    number: int
    jobs: list[Job] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)


class JobSetController:
    """Drives the containers of one JobSet like the JobSet and Job controllers drive its pods.

    `reconcile()` is one pass of the loop; `run(timeout)` reconciles until the JobSet has finished.
    `on_attempt(attempt)` is called after a new attempt's pods have started (restart attempt 0 too)."""

    def __init__(
        self,
        spec: JobSetSpec,
        objects: list[dict[str, Any]],
        cluster: Cluster,
        on_attempt: Callable[[Attempt], None] | None = None,
    ) -> None:
        self.spec = spec
        self.cluster = cluster
        self.configmaps = configmaps_of(objects)
        self.on_attempt = on_attempt
        self.restarts = 0
        self.restarts_count_towards_max = 0
        self.condition: Condition | None = None
        self.acted_on: Job | None = None  # the failed Job the failure policy last acted on
        self.attempts: list[Attempt] = []
        self.events: list[str] = []
        self.pod_backoff_s = BACKOFF_S  # the Job controller's back-off before replacing a counted failure

    # -- state ------------------------------------------------------------------------------------

    @property
    def terminal_state(self) -> str | None:
        return self.condition.type if self.condition else None

    @property
    def attempt(self) -> Attempt:
        return self.attempts[-1]

    def pods(self, replicated_job: str) -> list[Pod]:
        """The current attempt's pods of a replicated job, in (job index, completion index) order."""
        return [p for j in self.attempt.jobs if j.replicated_job == replicated_job for p in j.pods]

    def pod_specs(self) -> list[PodSpec]:
        return [p.spec for j in self.attempt.jobs for p in j.pods]

    def status(self) -> dict[str, Any]:
        """The JobSet's status as the API would show it (the fields `maskrcnn-dist status` reads)."""
        conditions = [vars(self.condition)] if self.condition else []
        return {
            "restarts": self.restarts,
            "restartsCountTowardsMax": self.restarts_count_towards_max,
            "terminalState": self.terminal_state,
            "conditions": conditions,
        }

    # -- the loop --------------------------------------------------------------------------------

    def start(self) -> Attempt:
        return self._create_attempt()

    def run(self, timeout: float, poll: float = 0.5) -> str:
        """Reconcile until the JobSet is Completed or Failed; its terminal state."""
        deadline = time.monotonic() + timeout
        while self.reconcile() is None:
            if time.monotonic() > deadline:
                raise DockerError(f"JobSet {self.spec.name}: not finished within {timeout:.0f}s ({self.describe()})")
            time.sleep(poll)
        return self.terminal_state

    def reconcile(self) -> str | None:
        """One pass: observe the pods, update the Jobs, apply the failure and success policies."""
        if self.condition is not None:
            return self.terminal_state
        for job in self.attempt.jobs:
            self._update_job(job)
        failed = [j for j in self.attempt.jobs if j.condition == "Failed"]
        if failed:
            self._execute_failure_policy(failed)
        elif self._success_policy_met():
            self._finish("Completed", COMPLETED_REASON, "jobset completed successfully")
        return self.terminal_state

    def describe(self) -> str:
        jobs = ", ".join(
            f"{j.name}: {j.condition or 'active'} "
            f"[{' '.join(str(p.exit_code) if p.exit_code is not None else 'running' for p in j.pods)}]"
            + (f" ({j.reason}: {j.message})" if j.condition == "Failed" else "")
            for j in self.attempt.jobs
        )
        return f"restart attempt {self.attempt.number}, {jobs}"

    # -- Jobs ------------------------------------------------------------------------------------

    def _update_job(self, job: Job) -> None:
        if job.condition is not None:
            return
        observe_exits(job, self.cluster)
        rjob = self._rjob(job.replicated_job)
        failure = job_failure(job, rjob, self.spec.namespace)
        if failure is not None:
            self._fail_job(job, failure)
        elif job.complete:
            job.condition = "Complete"
            self._event(f"job {job.name} complete")
        else:
            now = datetime.now(timezone.utc)
            for pod in to_replace(job, rjob, self.spec.namespace, now, self.pod_backoff_s):
                self._replace_pod(job, rjob, pod)

    def _replace_pod(self, job: Job, rjob: ReplicatedJob, pod: Pod) -> None:
        """The Job controller's replacement: a new pod (new name, same host name) under the old one's index."""
        new = self._create_pod(rjob, job.name, job.index, pod.index)
        job.replaced.append(pod)
        job.pods[job.pods.index(pod)] = new
        self.cluster.start(new.container)
        self._event(f"job {job.name}: pod {pod.spec.name} exited {pod.exit_code}, replaced by {new.spec.name}")

    def _fail_job(self, job: Job, failure: JobFailure) -> None:
        """The Job controller marks the Job failed and terminates its pods that still run."""
        pod = failure.pod
        job.condition, job.reason, job.message = "Failed", failure.reason, failure.message
        job.failed_by = pod
        self._event(f"job {job.name} failed ({failure.reason}): pod {pod.spec.host} exited {pod.exit_code}")
        self._delete_pods(job.pods)

    # -- JobSet ----------------------------------------------------------------------------------

    def _execute_failure_policy(self, failed: list[Job]) -> None:
        rule, job = acting_rule(self.spec.rules, failed)
        self.acted_on = job
        action = rule.action if rule else DEFAULT_ACTION
        if rule is not None:
            self._event(f"failure policy rule {rule.name} matches job {job.name} ({job.reason}): {action}")
        else:
            self._event(f"no failure policy rule matches job {job.name} ({job.reason}): the default, {action}")
        first = f"(first failed job: {job.name})"
        if action == "FailJobSet":
            self._finish("Failed", FAIL_JOBSET_REASON, f"applying FailJobSet failure policy action {first}")
        elif action == "RestartJobSet" and self.restarts_count_towards_max >= self.spec.max_restarts:
            self._finish("Failed", MAX_RESTARTS_REASON, f"jobset failed due to reaching max number of restarts {first}")
        else:
            self.restarts += 1
            if action == "RestartJobSet":
                self.restarts_count_towards_max += 1
            self._event(f"restart {self.restarts}: recreating every job ({self.spec.restart_strategy})")
            self._delete_jobs(self.attempt.jobs)
            self._create_attempt()

    def _success_policy_met(self) -> bool:
        targets = self.spec.success_targets or tuple(r.name for r in self.spec.replicated_jobs)
        done = [j for j in self.attempt.jobs if j.condition == "Complete" and j.replicated_job in targets]
        if self.spec.success_operator == "Any":
            return bool(done)
        return len(done) >= sum(r.replicas for r in self.spec.replicated_jobs if r.name in targets)

    def _finish(self, state: str, reason: str, message: str) -> None:
        self.condition = Condition(state, reason, message)
        self._event(f"JobSet {state} ({reason}): {message}")
        # A finished JobSet deletes its active Jobs (their pods stop, their GPUs are released).
        self._delete_jobs([j for j in self.attempt.jobs if j.condition is None])

    # -- pods ------------------------------------------------------------------------------------

    def _create_attempt(self) -> Attempt:
        attempt = Attempt(self.restarts)
        for rjob in self.spec.replicated_jobs:
            for job_index in range(rjob.replicas):
                job_name = f"{self.spec.name}-{rjob.name}-{job_index}"
                pods = [self._create_pod(rjob, job_name, job_index, i) for i in range(rjob.completions)]
                attempt.jobs.append(Job(job_name, rjob.name, job_index, pods))
        self.attempts.append(attempt)
        self.cluster.start(*(p.container for j in attempt.jobs for p in j.pods))
        hosts = ", ".join(p.spec.host for j in attempt.jobs for p in j.pods)
        self._event(f"restart attempt {attempt.number}: started {hosts}")
        if self.on_attempt is not None:
            self.on_attempt(attempt)
        return attempt

    def _create_pod(self, rjob: ReplicatedJob, job_name: str, job_index: int, index: int) -> Pod:
        template = rjob.pod_template
        metadata = template.get("metadata") or {}
        jobset_keys = {
            JOBSET_NAME: self.spec.name,
            REPLICATED_JOB: rjob.name,
            REPLICATED_JOB_REPLICAS: str(rjob.replicas),
            JOB_INDEX: str(job_index),
            RESTART_ATTEMPT: str(self.restarts),
        }
        job_keys = {JOB_NAME: job_name, COMPLETION_INDEX: str(index)}
        labels = {**metadata.get("labels", {}), **jobset_keys, **job_keys}
        annotations = {**metadata.get("annotations", {}), **jobset_keys, COMPLETION_INDEX: str(index)}
        hostname = f"{job_name}-{index}"
        name = f"{hostname}-{''.join(random.choices(_SUFFIX_ALPHABET, k=5))}"
        spec = pod_from_template(
            template,
            name=name,
            owner=job_name,
            ordinal=index,
            namespace=self.spec.namespace,
            service=self.spec.subdomain,
            pod_ip=self.cluster.ip_for(name),
            configmaps=self.configmaps,
            hostname=hostname,
            labels=labels,
            annotations=annotations,
            extra_env={COMPLETION_INDEX_ENV: str(index)},
        )
        container = self.cluster.create_pod(spec, labels={"maskrcnn-e2e.attempt": str(self.restarts)})
        return Pod(spec, container, index)

    def delete_pod(self, pod: Pod, disruption: str | None = None) -> None:
        """Take one pod away: with a `disruption` reason (DISRUPTION_REASONS) the pod first gets the
        DisruptionTarget condition, as a preemption or an eviction gives it; without, it is a plain
        `kubectl delete pod`. Then SIGTERM, SIGKILL after its grace period; returns once it has exited."""
        if disruption is not None:
            if disruption not in DISRUPTION_REASONS:
                raise ValueError(f"{disruption!r} is not a DisruptionTarget reason: {', '.join(DISRUPTION_REASONS)}")
            pod.conditions.append(PodCondition(DISRUPTION_TARGET, "True", disruption))
        self._event(f"pod {pod.spec.name} deleted" + (f" ({DISRUPTION_TARGET}: {disruption})" if disruption else ""))
        self._delete_pods([pod])

    def _delete_jobs(self, jobs: list[Job]) -> None:
        """Delete Jobs (foreground): their pods stop; return once all have (what BlockingRecreate waits for)."""
        self._delete_pods([p for j in jobs for p in j.pods])

    def _delete_pods(self, pods: list[Pod]) -> None:
        """Every pod still running gets SIGTERM, then SIGKILL after its grace period. A pod that exited
        on its own since the last look keeps its own exit code, as its status would show it."""
        running = [p for p in pods if self.cluster.state(p.container).running]
        if running:
            self.cluster.stop([p.container for p in running], grace=max(p.spec.grace_seconds for p in running))
        for pod in pods:
            if pod.exit_code is None and (state := self.cluster.state(pod.container)).status == "exited":
                pod.record_exit(state)
        if running:
            self._event(f"deleted pods {', '.join(p.spec.host for p in running)}")

    # -- helpers ---------------------------------------------------------------------------------

    def _rjob(self, name: str) -> ReplicatedJob:
        return next(r for r in self.spec.replicated_jobs if r.name == name)

    def _event(self, text: str) -> None:
        self.events.append(text)
        log.info("jobset %s: %s", self.spec.name, text)


def jobset_controller(
    objects: list[dict[str, Any]],
    namespace: str,
    cluster: Cluster,
    on_attempt: Callable[[Attempt], None] | None = None,
) -> JobSetController:
    obj = find_jobset(objects)
    if obj is None:
        raise SpecError("no JobSet rendered (render with workload=jobset or --api-versions jobset.x-k8s.io/v1alpha2)")
    return JobSetController(parse_jobset(obj, namespace), objects, cluster, on_attempt)
