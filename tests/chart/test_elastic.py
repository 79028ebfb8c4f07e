"""jobset.elastic (ddp): the workers' Job replaces a lost worker pod alone, the master's Job and the
JobSet's rules stay as they are (a user error fails the JobSet, a lost master restarts the group)."""

from __future__ import annotations

import re

import pytest
from maskrcnn_launcher.boundary import EXIT_STOPPED, EXIT_USER_ERROR

from .conftest import CHART, RELEASE
from .objects import one, replicated_jobs
from .test_failure_policy import EXIT_CODE_MESSAGE, POD, POD_RULES, acting_rule, failure_rules
from .validate import validate_jobset

ELASTIC = ("engine=ddp", "workload=jobset", "jobset.elastic.enabled=true", "jobset.elastic.workerReplacements=4")
# The elastic workers' rules: the user error's index (0) is the one the JobSet's UserError rule matches.
WORKER_RULES = [
    POD_RULES[0],
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EXIT_STOPPED]}},
]


def test_the_workers_job_replaces_a_lost_pod_and_the_masters_does_not(render) -> None:
    jobs = {role: rjob["template"]["spec"] for role, rjob in replicated_jobs(render("default", *ELASTIC)).items()}
    assert jobs["worker"]["podFailurePolicy"]["rules"] == WORKER_RULES
    assert jobs["worker"]["backoffLimit"] == 4
    # With podFailurePolicy the API allows only Failed: the old pod has terminated before the new one starts.
    assert jobs["worker"]["podReplacementPolicy"] == "Failed"
    assert jobs["master"]["podFailurePolicy"]["rules"] == POD_RULES
    assert jobs["master"]["backoffLimit"] == 0 and "podReplacementPolicy" not in jobs["master"]


def test_every_trainer_is_started_with_elastic(render) -> None:
    """The pods' Job replaces a lost worker; the trainers themselves go on without it (--elastic)."""
    for role, rjob in replicated_jobs(render("default", *ELASTIC)).items():
        (container,) = [c for c in rjob["template"]["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer"]
        assert container["args"][-1] == "--elastic", role
    for rjob in replicated_jobs(render("default", "engine=ddp", "workload=jobset")).values():
        assert "--elastic" not in rjob["template"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_off_by_default_and_every_job_fails_on_its_first_lost_pod(render) -> None:
    for role, rjob in replicated_jobs(render("default", "engine=ddp", "workload=jobset")).items():
        assert rjob["template"]["spec"]["podFailurePolicy"]["rules"] == POD_RULES, role
        assert rjob["template"]["spec"]["backoffLimit"] == 0, role


def test_a_workers_user_error_still_fails_the_jobset(render) -> None:
    rules = failure_rules(render("default", *ELASTIC))
    message = EXIT_CODE_MESSAGE.format(**POD, code=EXIT_USER_ERROR, index=0)
    assert acting_rule(rules, "PodFailurePolicy", message) == "UserError"
    # Replacements used up: the default action, a counted whole-group restart.
    assert acting_rule(rules, "BackoffLimitExceeded", "Job has reached the specified backoff limit") is None


def test_the_elastic_jobset_validates_against_the_published_crd(render, jobset_schema) -> None:
    validate_jobset(one(render("default", *ELASTIC), "JobSet"), jobset_schema)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("workload=jobset", "jobset.elastic.enabled=true"), "jobset.elastic.enabled needs engine=ddp"),
        (("engine=ddp", "jobset.elastic.workerReplacements=-1"), "workerReplacements"),
        (("engine=ddp", "jobset.elastic.replacements=2"), "replacements"),
    ],
)
def test_elastic_values_are_checked(run_helm, sets: tuple[str, ...], message: str) -> None:
    args = [a for s in sets for a in ("--set", s)]
    proc = run_helm("template", RELEASE, str(CHART), *args)
    assert proc.returncode != 0, sets
    assert re.search(re.escape(message), proc.stderr), proc.stderr
