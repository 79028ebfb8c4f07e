"""The emulated Job and JobSet controllers' rule matching (e2e/cluster/failure_rules.py), pinned to what
their sources do, and the chart's rules run through it: which podFailurePolicy rule a failed pod
meets and the Job's message, which failure policy rule then acts, and what the JobSet does.

Sources: Kubernetes pkg/controller/job/pod_failure_policy.go (rules in order, first match; exit 0
never matches; In / NotIn; conditions by type and status; the two FailJob messages), kubernetes-sigs/jobset
pkg/controllers/failure_policy.go (rules in order, the earliest failed Job a rule applies to; the
default RestartJobSet; RestartJobSetAndIgnoreMaxRestarts leaves restartsCountTowardsMax alone) and its
integration test of onJobFailureMessagePatterns (a pattern matches inside a longer message).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from maskrcnn_launcher.boundary import EXIT_STOPPED

from e2e.cluster import SpecError
from e2e.cluster.failure_rules import (
    FailedPod,
    FailureRule,
    PodCondition,
    PodFailureRule,
    acting_rule,
    match_pod_failure_policy,
    parse_failure_rules,
    parse_pod_failure_rules,
)
from e2e.cluster.job import to_replace

POD = "e2e-maskrcnn-dist-workers-0-1-x7k2p"
DISRUPTED = (PodCondition("DisruptionTarget", "True", "EvictionByEvictionAPI"),)
EXIT_MESSAGE = "Container trainer for pod e2e/{pod} failed with exit code {code} matching FailJob rule at index {index}"
CONDITION_MESSAGE = "Pod e2e/{pod} has condition DisruptionTarget matching FailJob rule at index 1"
# A failed trainer pod -> (the Job's reason, the failure policy rule that acts: None is the default
# RestartJobSet, counted), under the chart's rules.
CHART_TABLE = [
    (2, (), "PodFailurePolicy", EXIT_MESSAGE.format(pod=POD, code=2, index=0), "UserError"),
    (EXIT_STOPPED, (), "PodFailurePolicy", EXIT_MESSAGE.format(pod=POD, code=EXIT_STOPPED, index=2), "StoppedCleanly"),
    (1, (), "BackoffLimitExceeded", "", None),
    (137, (), "BackoffLimitExceeded", "", None),
    (143, (), "BackoffLimitExceeded", "", None),
    (EXIT_STOPPED, DISRUPTED, "PodFailurePolicy", CONDITION_MESSAGE.format(pod=POD), "Disruption"),
    (137, DISRUPTED, "PodFailurePolicy", CONDITION_MESSAGE.format(pod=POD), "Disruption"),
    (2, DISRUPTED, "PodFailurePolicy", EXIT_MESSAGE.format(pod=POD, code=2, index=0), "UserError"),
    (143, (PodCondition("DisruptionTarget", "False"),), "BackoffLimitExceeded", "", None),
]


def chart_rules(jobset_render) -> tuple[tuple[PodFailureRule, ...], tuple[FailureRule, ...]]:
    jobset = next(o for o in jobset_render() if o["kind"] == "JobSet")
    job = jobset["spec"]["replicatedJobs"][1]["template"]["spec"]
    return parse_pod_failure_rules("workers", job["podFailurePolicy"]), parse_failure_rules(
        "t", jobset["spec"]["failurePolicy"]["rules"]
    )


def failed_job(reason: str, message: str, second: int = 0, replicated_job: str = "workers") -> SimpleNamespace:
    at = datetime(2025, 1, 1) + timedelta(seconds=second)
    return SimpleNamespace(
        name=f"job-{second}", replicated_job=replicated_job, reason=reason, message=message, failed_at=at
    )


def test_the_chart_table(jobset_render):
    pod_rules, rules = chart_rules(jobset_render)
    for code, conditions, reason, message, expected in CHART_TABLE:
        verdict = match_pod_failure_policy(pod_rules, FailedPod("e2e", POD, "trainer", code, conditions))
        assert (verdict.action == "FailJob") == (reason == "PodFailurePolicy"), (code, conditions)
        assert verdict.message == message, (code, conditions)
        rule, _ = acting_rule(rules, [failed_job(reason, message or "Job has reached the specified backoff limit")])
        assert (rule.name if rule else None) == expected, (code, conditions)


def test_pod_failure_rules_first_match_wins():
    both = [PodFailureRule("Count", None, "NotIn", (0, 2)), PodFailureRule("FailJob", None, "In", (3,))]
    pod = FailedPod("ns", "p", "c", 3, DISRUPTED)
    assert match_pod_failure_policy(both, pod).action == "Count", "the first rule decides"
    assert match_pod_failure_policy(both[::-1], pod).index == 0
    condition_first = [PodFailureRule("FailJob", conditions=(("DisruptionTarget", "True"),)), *both]
    verdict = match_pod_failure_policy(condition_first, pod)
    assert verdict.message == "Pod ns/p has condition DisruptionTarget matching FailJob rule at index 0"


@pytest.mark.parametrize(
    ("rule", "code", "matches"),
    [
        (PodFailureRule("FailJob", None, "In", (42,)), 42, True),
        (PodFailureRule("FailJob", None, "In", (42,)), 41, False),
        (PodFailureRule("FailJob", None, "NotIn", (42,)), 41, True),
        (PodFailureRule("FailJob", None, "NotIn", (42,)), 42, False),
        (PodFailureRule("FailJob", None, "NotIn", (42,)), 0, False),  # a success never matches
        (PodFailureRule("FailJob", "trainer", "In", (42,)), 42, True),
        (PodFailureRule("FailJob", "sidecar", "In", (42,)), 42, False),  # another container's exit
        (PodFailureRule("FailJob", None, "Between", (42,)), 42, False),  # an unknown operator
    ],
)
def test_on_exit_codes(rule, code, matches):
    verdict = match_pod_failure_policy([rule], FailedPod("ns", "p", "trainer", code))
    assert (verdict.action == "FailJob") is matches
    assert verdict.counts is not matches


@pytest.mark.parametrize(
    ("patterns", "conditions", "matches"),
    [
        ((("DisruptionTarget", "True"),), DISRUPTED, True),
        ((("DisruptionTarget", "True"),), (PodCondition("DisruptionTarget", "False"),), False),
        ((("ConfigIssue", "True"), ("DisruptionTarget", "True")), DISRUPTED, True),  # any pattern
        ((("DisruptionTarget", "True"),), (), False),
    ],
)
def test_on_pod_conditions(patterns, conditions, matches):
    verdict = match_pod_failure_policy(
        [PodFailureRule("FailJob", conditions=patterns)], FailedPod("ns", "p", "c", 137, conditions)
    )
    assert (verdict.action == "FailJob") is matches


def test_a_condition_pattern_without_status_means_true():
    (rule,) = parse_pod_failure_rules(
        "j", {"rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    )
    assert rule.conditions == (("DisruptionTarget", "True"),)


def test_failure_rules_in_order_then_the_earliest_job():
    early, late = (
        failed_job("PodFailurePolicy", "exit code 75", 1),
        failed_job("PodFailurePolicy", "DisruptionTarget", 2),
    )
    rules = [
        FailureRule("A", "RestartJobSetAndIgnoreMaxRestarts", patterns=("DisruptionTarget",)),
        FailureRule("B", "FailJobSet"),
    ]
    assert acting_rule(rules, [early, late]) == (rules[0], late), "the rule order, not the job order, decides"
    assert acting_rule(rules[1:], [late, early]) == (rules[1], early), "the earliest job the rule applies to"
    assert acting_rule([], [late, early]) == (None, early), "no rule: the default, on the earliest"


@pytest.mark.parametrize(
    ("rule", "matches"),
    [
        (FailureRule("r", "FailJobSet", patterns=("some message",)), True),  # found inside a longer message
        (FailureRule("r", "FailJobSet", patterns=("^some message",)), False),
        (FailureRule("r", "FailJobSet", patterns=("nothing", "critical")), True),  # any pattern
        (
            FailureRule("r", "FailJobSet", reasons=("PodFailurePolicy",), patterns=("critical",)),
            False,
        ),  # and the reason
        (FailureRule("r", "FailJobSet", reasons=("BackoffLimitExceeded",)), True),
        (FailureRule("r", "FailJobSet", targets=("master",)), False),
        (FailureRule("r", "FailJobSet", targets=("workers",)), True),
    ],
)
def test_a_failure_rule_applies(rule, matches):
    job = failed_job("BackoffLimitExceeded", "this is some message with critical error")
    assert (acting_rule([rule], [job])[0] is rule) is matches


def test_rules_the_emulation_cannot_run_are_refused():
    with pytest.raises(SpecError, match="not emulated"):
        parse_pod_failure_rules(
            "j", {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}]}
        )
    ignore = parse_pod_failure_rules(
        "j", {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [75]}}]}
    )
    verdict = match_pod_failure_policy(ignore, FailedPod("ns", "p", "c", 75))
    assert verdict.action == "Ignore" and not verdict.counts
    with pytest.raises(SpecError, match="pattern"):
        parse_failure_rules("js", [{"name": "r", "action": "FailJobSet", "onJobFailureMessagePatterns": ["(unclosed"]}])


# -- the emulated JobSet controller, the chart's JobSet, maxRestarts 0 ------------------------------

NO_RESTARTS = {"jobset": {"failurePolicy": {"maxRestarts": 0}}}


def test_disruptions_restart_the_group_without_counting(jobset_run):
    controller, cluster = jobset_run(NO_RESTARTS)
    cluster.stop_code = EXIT_STOPPED  # the trainer's clean stop on SIGTERM
    for attempt, reason in enumerate(("PreemptionByScheduler", "EvictionByEvictionAPI", "TerminationByKubelet"), 1):
        victim = controller.pods("workers")[1]
        controller.delete_pod(victim, disruption=reason)
        assert victim.exit_code == EXIT_STOPPED and victim.conditions[0].reason == reason
        assert controller.reconcile() is None, controller.describe()
        assert (controller.restarts, controller.restarts_count_towards_max) == (attempt, 0)
        assert any("rule Disruption matches" in e for e in controller.events)
    cluster.exit(controller.pods("master")[0].container, 0)
    assert controller.reconcile() == "Completed"


def test_a_clean_stop_without_a_disruption_does_not_count(jobset_run):
    """`kubectl delete pod`, and the peers of a disrupted pod: exit 75, no condition. The master's Job
    failing first (its trainer stopped the group) must not count a disruption."""
    controller, cluster = jobset_run(NO_RESTARTS)
    cluster.exit(controller.pods("master")[0].container, EXIT_STOPPED)
    controller.pods("workers")[1].conditions.append(DISRUPTED[0])
    cluster.exit(controller.pods("workers")[1].container, EXIT_STOPPED)
    assert controller.reconcile() is None, controller.describe()
    assert (controller.restarts, controller.restarts_count_towards_max) == (1, 0)
    assert any("rule Disruption matches job e2e-maskrcnn-dist-workers-0" in e for e in controller.events)
    cluster.stop_code = EXIT_STOPPED
    controller.delete_pod(controller.pods("workers")[0])  # no disruption: a plain deletion
    assert controller.reconcile() is None and controller.restarts_count_towards_max == 0
    assert any("rule StoppedCleanly matches" in e for e in controller.events)


def test_a_crash_still_counts(jobset_run):
    controller, cluster = jobset_run(NO_RESTARTS)
    controller.delete_pod(controller.pods("workers")[0], disruption="DeletionByTaintManager")  # exits 143
    assert controller.reconcile() is None and controller.restarts_count_towards_max == 0
    cluster.exit(controller.pods("workers")[1].container, 1)
    assert controller.reconcile() == "Failed"
    assert controller.condition.reason == "ReachedMaxRestarts" and controller.restarts == 1


def test_crashes_count_up_to_max_restarts_and_disruptions_do_not(jobset_run):
    controller, cluster = jobset_run({"jobset": {"failurePolicy": {"maxRestarts": 1}}})
    for victim, disruption in ((1, None), (0, "DeletionByPodGC"), (1, "PreemptionByScheduler")):
        pod = controller.pods("workers")[victim]
        controller.delete_pod(pod, disruption) if disruption else cluster.exit(pod.container, 137)
        assert controller.reconcile() is None, controller.describe()
    assert (controller.restarts, controller.restarts_count_towards_max) == (3, 1)
    cluster.exit(controller.pods("master")[0].container, 1)
    assert controller.reconcile() == "Failed" and controller.condition.reason == "ReachedMaxRestarts"


def test_a_user_error_on_a_disrupted_pod_still_fails_the_jobset(jobset_run):
    controller, cluster = jobset_run()
    pod = controller.pods("master")[0]
    pod.conditions.append(DISRUPTED[0])
    cluster.exit(pod.container, 2)
    assert controller.reconcile() == "Failed" and controller.condition.reason == "FailJobSetFailurePolicyAction"


def test_only_disruption_reasons_are_taken(jobset_run):
    controller, _ = jobset_run()
    with pytest.raises(ValueError, match="not a DisruptionTarget reason"):
        controller.delete_pod(controller.pods("master")[0], disruption="Evicted")


def test_a_pod_that_exits_while_the_jobset_fails_keeps_its_own_exit_code(jobset_run, monkeypatch):
    """A user error on every rank: the worker exits 2 and fails the JobSet; the master exits 2 a moment
    later, after the controller looked at its Job and before it deletes the Jobs still active. Its pod
    shows its own exit code, as a pod's status would, not none (seen in e2e jobset-user-error-ddp)."""
    controller, cluster = jobset_run()
    master, worker = controller.pods("master")[0], controller.pods("workers")[0]
    cluster.exit(worker.container, 2)
    look = cluster.state

    def state(name: str):
        if name == worker.container and cluster.states[master.container].running:
            cluster.exit(master.container, 2)  # the master's Job was looked at already: it is first
        return look(name)

    monkeypatch.setattr(cluster, "state", state)
    assert controller.reconcile() == "Failed" and controller.condition.reason == "FailJobSetFailurePolicyAction"
    assert master.exit_code == 2 and master.container not in cluster.stopped
    assert controller.acted_on.failed_by is worker  # the pod the e2e check reads the error line from


def test_the_failure_policy_acts_on_the_job_whose_pod_exited_first(jobset_run):
    """Every rank meets a user error (ddp): the Job whose pod exited first is the one acted on, and
    its deciding pod is the one whose log holds the error (what e2e jobset-user-error-ddp reads)."""
    controller, cluster = jobset_run()
    master, worker = controller.pods("master")[0], controller.pods("workers")[0]
    cluster.exit(master.container, 2, second=9)
    cluster.exit(worker.container, 2, second=3)
    assert controller.reconcile() == "Failed" and controller.condition.reason == "FailJobSetFailurePolicyAction"
    assert controller.acted_on.failed_by is worker and "workers" in controller.condition.message


# -- jobset.elastic: the workers' Job replaces a lost pod alone ---------------------------------------

ELASTIC = {"engine": "ddp", "ddp": {"workers": 2}, "jobset": {"elastic": {"enabled": True, "workerReplacements": 2}}}


def test_an_elastic_workers_job_replaces_a_lost_pod_without_restarting_the_group(jobset_run):
    controller, cluster = jobset_run(ELASTIC)
    lost = controller.pods("workers")[1]
    cluster.exit(lost.container, 137)  # a crash: counted, 1 of 2
    assert controller.reconcile() is None, controller.describe()
    new = controller.pods("workers")[1]
    assert new is not lost and new.spec.host == lost.spec.host and new.spec.name != lost.spec.name
    assert new.container in cluster.running() and controller.restarts == 0
    assert new.spec.labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
    cluster.stop_code = EXIT_STOPPED
    controller.delete_pod(controller.pods("workers")[0], disruption="EvictionByEvictionAPI")  # Ignore
    assert controller.reconcile() is None
    controller.delete_pod(controller.pods("workers")[0])  # a drained worker, exit 75: Ignore
    assert controller.reconcile() is None and controller.restarts == 0
    assert len(controller.attempt.jobs[1].replaced) == 3
    cluster.exit(controller.pods("master")[0].container, 0)
    assert controller.reconcile() == "Completed" and controller.restarts == 0


def test_an_elastic_workers_job_fails_past_its_replacements_and_on_a_user_error(jobset_run):
    controller, cluster = jobset_run(ELASTIC)
    for crash in range(3):  # workerReplacements 2: the third crash fails the Job
        cluster.exit(controller.pods("workers")[crash % 2].container, 1)
        assert controller.reconcile() is None
    assert controller.restarts == 1 and controller.restarts_count_towards_max == 1  # the group restarted, counted
    assert any("BackoffLimitExceeded" in e for e in controller.events)
    cluster.exit(controller.pods("workers")[0].container, 2)
    assert controller.reconcile() == "Failed" and controller.condition.reason == "FailJobSetFailurePolicyAction"


def test_a_lost_master_still_restarts_the_elastic_group(jobset_run):
    controller, cluster = jobset_run(ELASTIC)
    cluster.exit(controller.pods("master")[0].container, 137)
    assert controller.reconcile() is None and controller.restarts == 1 and controller.attempt.number == 1


def test_a_counted_failure_is_replaced_after_the_back_off():
    rules = parse_pod_failure_rules(
        "j", {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [75]}}]}
    )
    rjob = SimpleNamespace(pod_template={"spec": {"containers": [{"name": "trainer"}]}}, pod_failure_rules=rules)
    at = datetime(2025, 1, 1, tzinfo=timezone.utc)
    pods = [
        SimpleNamespace(spec=SimpleNamespace(name=f"p{i}"), exit_code=code, finished_at=at, conditions=[])
        for i, code in enumerate((1, 75))
    ]
    job = SimpleNamespace(pods=pods, replaced=[])
    assert to_replace(job, rjob, "ns", at + timedelta(seconds=1)) == [pods[1]]  # the ignored one at once
    assert to_replace(job, rjob, "ns", at + timedelta(seconds=10)) == pods
    job.replaced = [SimpleNamespace(spec=SimpleNamespace(name="old"), exit_code=1, conditions=[])]  # one counted before
    assert to_replace(job, rjob, "ns", at + timedelta(seconds=15)) == [pods[1]]  # 20 s now
    assert to_replace(job, rjob, "ns", at + timedelta(seconds=20)) == pods
