"""How the Job and JobSet controllers match a failure against their rules, as their sources do it:
pure functions over what the controllers read, no docker.

* podFailurePolicy (Kubernetes pkg/controller/job/pod_failure_policy.go, matchPodFailurePolicy): the
  rules in order; the first whose requirement a failed pod meets decides. onExitCodes: a container
  (`containerName`, or any) that exited non-zero with a code In / NotIn `values` (another operator
  never matches); onPodConditions: one of the patterns has the type and status of one of the pod's
  conditions (status True unless given). FailJob fails the Job with reason PodFailurePolicy and the
  controller's message, which names the rule's index; Count, and no matching rule, count the pod
  against backoffLimit; Ignore counts nothing (the Job replaces the pod all the same). FailIndex is
  refused (parse_pod_failure_rules): the emulated Job controller has no per-index limits.
* The JobSet's failurePolicy (kubernetes-sigs/jobset pkg/controllers/failure_policy.go,
  findFirstFailedPolicyRuleAndJob, ruleIsApplicable): the rules in order; the first that applies to
  one of the failed Jobs acts, on the earliest of those. A rule applies to a Job when its
  onJobFailureReasons hold the Job's reason, one of its onJobFailureMessagePatterns is found in the
  Job's message (Go's regexp match: anywhere, as `re.search`; the patterns are RE2, compiled here
  with Python's `re`, which reads the same for the common syntax) and its targetReplicatedJobs name
  the Job's replicated job; an empty list matches anything. No rule applies: RestartJobSet, on the
  earliest failed Job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from .pods import SpecError

# Job failure reasons, and the backoff limit's message, as the Job controller writes them.
POD_FAILURE_POLICY = "PodFailurePolicy"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
BACKOFF_LIMIT_MESSAGE = "Job has reached the specified backoff limit"
# The condition Kubernetes puts on a pod it is about to delete for a disruption, and its reasons
# (kubernetes.io, Pod disruption conditions).
DISRUPTION_TARGET = "DisruptionTarget"
DISRUPTION_REASONS = (
    "PreemptionByScheduler",
    "DeletionByTaintManager",
    "EvictionByEvictionAPI",
    "DeletionByPodGC",
    "TerminationByKubelet",
)
# The podFailurePolicy actions the emulated Job controller carries out.
POD_ACTIONS = ("FailJob", "Count", "Ignore")
# The JobSet failure policy's actions the emulated controller carries out, and its default.
JOBSET_ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
DEFAULT_ACTION = "RestartJobSet"


@dataclass(frozen=True)
class PodCondition:
    type: str
    status: str = "True"
    reason: str = ""


@dataclass(frozen=True)
class FailedPod:
    """What the Job controller reads of a failed pod (one container)."""

    namespace: str
    name: str
    container: str
    exit_code: int
    conditions: tuple[PodCondition, ...] = ()


@dataclass(frozen=True)
class PodFailureRule:
    """One podFailurePolicy rule: on exit codes (`operator` set) or on pod conditions."""

    action: str
    container: str | None = None
    operator: str = ""  # In | NotIn
    values: tuple[int, ...] = ()
    conditions: tuple[tuple[str, str], ...] = ()  # (type, status)

    def matched_by(self, pod: FailedPod) -> str | None:
        """What of the pod meets the requirement (its exit code, or a condition's type), else None."""
        if self.operator:
            if self.container not in (None, pod.container) or pod.exit_code == 0:
                return None
            if self.operator not in ("In", "NotIn") or (pod.exit_code in self.values) != (self.operator == "In"):
                return None
            return str(pod.exit_code)
        return next((c.type for c in pod.conditions if (c.type, c.status) in self.conditions), None)


@dataclass(frozen=True)
class PodFailureVerdict:
    """The first matching rule's action and index (None: no rule matched) and a FailJob's message."""

    action: str | None
    index: int | None = None
    message: str = ""

    @property
    def counts(self) -> bool:
        """Counted against backoffLimit: a Count rule, or none."""
        return self.action in (None, "Count")


def match_pod_failure_policy(rules: Sequence[PodFailureRule], pod: FailedPod) -> PodFailureVerdict:
    for index, rule in enumerate(rules):
        what = rule.matched_by(pod)
        if what is None:
            continue
        if rule.action != "FailJob":
            return PodFailureVerdict(rule.action, index)
        # The Job controller's two FailJob messages (pod_failure_policy.go), word for word.
        if rule.operator:
            cause = f"Container {pod.container} for pod {pod.namespace}/{pod.name} failed with exit code {what}"
        else:
            cause = f"Pod {pod.namespace}/{pod.name} has condition {what}"
        return PodFailureVerdict(rule.action, index, f"{cause} matching {rule.action} rule at index {index}")
    return PodFailureVerdict(None)


@dataclass(frozen=True)
class FailureRule:
    """One rule of the JobSet's failurePolicy."""

    name: str
    action: str  # one of JOBSET_ACTIONS
    reasons: tuple[str, ...] = ()  # empty: any
    patterns: tuple[str, ...] = ()  # empty: any message
    targets: tuple[str, ...] = ()  # empty: every replicated job

    def applies(self, replicated_job: str, reason: str, message: str) -> bool:
        return (
            (not self.reasons or reason in self.reasons)
            and (not self.patterns or any(re.search(p, message) for p in self.patterns))
            and (not self.targets or replicated_job in self.targets)
        )


class FailedJob(Protocol):
    replicated_job: str
    reason: str
    message: str
    failed_at: datetime | None


J = TypeVar("J", bound=FailedJob)


def acting_rule(rules: Sequence[FailureRule], failed: Sequence[J]) -> tuple[FailureRule | None, J]:
    """The rule that acts on these failed Jobs and the Job it acts on (None: the default action)."""
    by_time = sorted(failed, key=lambda j: j.failed_at or datetime.min)
    for rule in rules:
        for job in by_time:
            if rule.applies(job.replicated_job, job.reason, job.message):
                return rule, job
    return None, by_time[0]


def parse_pod_failure_rules(where: str, policy: dict[str, Any] | None) -> tuple[PodFailureRule, ...]:
    """A Job's podFailurePolicy; SpecError for what the emulated Job controller cannot do."""
    rules = []
    for rule in (policy or {}).get("rules") or []:
        action, codes, conditions = rule["action"], rule.get("onExitCodes"), rule.get("onPodConditions")
        if action not in POD_ACTIONS or (codes is None) == (conditions is None):
            raise SpecError(
                f"{where}: podFailurePolicy rule {rule}: not emulated ({', '.join(POD_ACTIONS)}; one requirement)"
            )
        if codes is not None:
            values = tuple(int(v) for v in codes["values"])
            rules.append(PodFailureRule(action, codes.get("containerName"), codes["operator"], values))
        else:
            patterns = tuple((c["type"], c.get("status", "True")) for c in conditions)
            rules.append(PodFailureRule(action, conditions=patterns))
    return tuple(rules)


def parse_failure_rules(where: str, rules: list[dict[str, Any]] | None) -> tuple[FailureRule, ...]:
    """A JobSet's failurePolicy rules; SpecError for an action not emulated or a pattern that does not compile."""
    parsed = []
    for i, rule in enumerate(rules or []):
        if rule["action"] not in JOBSET_ACTIONS:
            raise SpecError(f"{where}: failure policy action {rule['action']} is not emulated")
        patterns = tuple(rule.get("onJobFailureMessagePatterns") or ())
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise SpecError(f"{where}: failure policy rule {i}: pattern {pattern!r}: {exc}") from exc
        name = rule.get("name") or f"failurePolicyRule{i}"
        reasons, targets = tuple(rule.get("onJobFailureReasons") or ()), tuple(rule.get("targetReplicatedJobs") or ())
        parsed.append(FailureRule(name, rule["action"], reasons, patterns, targets))
    return tuple(parsed)
