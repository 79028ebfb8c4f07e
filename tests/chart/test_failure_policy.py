"""The JobSet's failure handling (templates/_failure_policy.tpl): its podFailurePolicy rules in their
order, the failure policy's rules in theirs, and message patterns that find the messages the Job
controller writes, each the message of exactly one podFailurePolicy rule.

The messages are built from the Job controller's own format strings (Kubernetes
pkg/controller/job/pod_failure_policy.go, matchPodFailurePolicy) and job_controller.go's backoff limit
message; the JobSet controller matches a pattern anywhere in the message (Go's regexp match, RE2), as
`re.search` does for these patterns. How the emulated controllers act on the same rules is
tests/e2e/test_jobset_rules.py's.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from maskrcnn_launcher.boundary import EXIT_STOPPED, EXIT_USER_ERROR

from .conftest import RELEASE
from .objects import JOBSET_CASE_IDS, JOBSET_CASES, SCENARIO_NAMES, one, replicated_jobs, trainer
from .validate import validate_jobset

pytestmark = pytest.mark.needs_helm

# The Job controller's FailJob messages (Go format strings, as in pod_failure_policy.go) and its
# BackoffLimitExceeded message (job_controller.go).
EXIT_CODE_MESSAGE = (
    "Container {container} for pod {namespace}/{pod} failed with exit code {code} "
    "matching FailJob rule at index {index}"
)
CONDITION_MESSAGE = "Pod {namespace}/{pod} has condition {condition} matching FailJob rule at index {index}"
BACKOFF_MESSAGE = "Job has reached the specified backoff limit"

# The podFailurePolicy, in its order: the index is part of each FailJob message.
POD_RULES = [
    {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EXIT_USER_ERROR]}},
    {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EXIT_STOPPED]}},
]
# Each failure, the (reason, message) of the Job it fails, and the failure policy rule that acts on it
# (None: no rule, the default RestartJobSet counted against maxRestarts).
POD = {"namespace": "ml-team", "pod": f"{RELEASE}-maskrcnn-dist-workers-0-1-x7k2p", "container": "trainer"}
FAILURES: dict[str, tuple[str, str, str | None]] = {
    "exit 2": ("PodFailurePolicy", EXIT_CODE_MESSAGE.format(**POD, code=EXIT_USER_ERROR, index=0), "UserError"),
    "disrupted": (
        "PodFailurePolicy",
        CONDITION_MESSAGE.format(**POD, condition="DisruptionTarget", index=1),
        "Disruption",
    ),
    "exit 75": ("PodFailurePolicy", EXIT_CODE_MESSAGE.format(**POD, code=EXIT_STOPPED, index=2), "StoppedCleanly"),
    "exit 1": ("BackoffLimitExceeded", BACKOFF_MESSAGE, None),
}
ACTIONS = {
    "UserError": "FailJobSet",
    "Disruption": "RestartJobSetAndIgnoreMaxRestarts",
    "StoppedCleanly": "RestartJobSetAndIgnoreMaxRestarts",
}


def failure_rules(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return one(objects, "JobSet")["spec"]["failurePolicy"]["rules"]


def acting_rule(rules: list[dict[str, Any]], reason: str, message: str) -> str | None:
    """The first rule whose reasons hold `reason` and one of whose patterns finds `message`."""
    for rule in rules:
        reasons, patterns = rule.get("onJobFailureReasons") or [], rule.get("onJobFailureMessagePatterns") or []
        if (not reasons or reason in reasons) and (not patterns or any(re.search(p, message) for p in patterns)):
            return rule["name"]
    return None


@pytest.mark.parametrize(("scenario", "jobset_api"), JOBSET_CASES, ids=JOBSET_CASE_IDS)
def test_every_job_has_the_pod_failure_rules_in_order(render, scenario: str, jobset_api: bool) -> None:
    for role, rjob in replicated_jobs(render(scenario, jobset_api=jobset_api)).items():
        job = rjob["template"]["spec"]
        assert job["podFailurePolicy"]["rules"] == POD_RULES, role
        assert trainer(job["template"])["name"] == "trainer", "the rules name the container"
        assert job["backoffLimit"] == 0 and job["template"]["spec"]["restartPolicy"] == "Never", role


@pytest.mark.parametrize(("scenario", "jobset_api"), JOBSET_CASES, ids=JOBSET_CASE_IDS)
def test_the_failure_policy_rules_in_order(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    policy = one(objects, "JobSet")["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == values(scenario)["jobset"]["failurePolicy"]["maxRestarts"]
    assert [(r["name"], r["action"]) for r in policy["rules"]] == list(ACTIONS.items())
    for rule in policy["rules"]:
        assert rule["onJobFailureReasons"] == ["PodFailurePolicy"], rule["name"]
        assert not rule.get("targetReplicatedJobs"), f"{rule['name']}: for every replicated job"


@pytest.mark.parametrize("failure", list(FAILURES))
def test_each_failure_meets_its_rule(render, failure: str) -> None:
    """The patterns, as rendered, against the Job controller's messages: each failure is acted on by
    its own rule, and a crash by none (the default: RestartJobSet, counted)."""
    reason, message, expected = FAILURES[failure]
    assert acting_rule(failure_rules(render("default", "workload=jobset")), reason, message) == expected


def test_each_pattern_finds_the_message_of_one_pod_failure_rule(render) -> None:
    rules = failure_rules(render("default", "workload=jobset"))
    messages = {m for _, m, _ in FAILURES.values()}
    for rule in rules:
        (pattern,) = rule["onJobFailureMessagePatterns"]
        assert pattern.startswith("^") and pattern.endswith("$"), f"{rule['name']}: anchored at both ends"
        assert [m for m in messages if re.search(pattern, m)] == [FAILURES[_failure_of(rule["name"])][1]]
    # Another exit code, another pod failure rule's index, another container: no rule.
    for code, index, container in ((21, 0, "trainer"), (2, 1, "trainer"), (75, 0, "trainer"), (2, 0, "sidecar")):
        message = EXIT_CODE_MESSAGE.format(**{**POD, "container": container}, code=code, index=index)
        assert acting_rule(rules, "PodFailurePolicy", message) is None, message
    other = CONDITION_MESSAGE.format(**POD, condition="ConfigIssue", index=1)
    assert acting_rule(rules, "PodFailurePolicy", other) is None


def _failure_of(rule: str) -> str:
    return next(f for f, (_, _, name) in FAILURES.items() if name == rule)


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_the_rules_validate_against_the_published_crd(render, jobset_schema, scenario: str) -> None:
    """The JobSet v0.12.0 CRD (unknown fields refused) accepts the rules: message patterns, the
    RestartJobSetAndIgnoreMaxRestarts action, onPodConditions."""
    validate_jobset(one(render(scenario, "workload=jobset"), "JobSet"), jobset_schema)


def test_a_pattern_outside_the_crd_is_refused(render, jobset_schema) -> None:
    """The validation above would catch a misspelt field: it is strict."""
    jobset = copy.deepcopy(one(render("default", "workload=jobset"), "JobSet"))  # the render is cached
    rule = jobset["spec"]["failurePolicy"]["rules"][1]
    rule["onJobFailureMessagePattern"] = rule.pop("onJobFailureMessagePatterns")
    with pytest.raises(AssertionError, match="onJobFailureMessagePattern"):
        validate_jobset(jobset, jobset_schema)
