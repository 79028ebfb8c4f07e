{{/*
What a JobSet does when a training pod fails, in one place: the podFailurePolicy of every replicated
Job and the rules of the JobSet's failurePolicy, which read what the first one writes. The chart's
JobSet (jobset.yaml) and the Kubeflow training runtime's JobSet template (trainingruntime.yaml)
include maskrcnn-dist.jobsetFailurePolicy and maskrcnn-dist.jobFailurePolicy below, so they follow
the same rules. This comment is the one description of the JobSet's failure semantics; the other
templates, the chart's README and the docs link here.

  exit 2 (EXIT_USER_ERROR: bad flags, a bad dataset)       -> the JobSet fails at once
  a pod with the DisruptionTarget condition (preempted,
    evicted, drained, its node gone)                       -> the group restarts, not counted
  exit 75 (EXIT_STOPPED: SIGTERM, a checkpoint of the step
    it stopped at written) without that condition          -> the group restarts, not counted
  anything else (a crash, OOM, SIGKILL, a lost peer)       -> the group restarts, counted against
                                                              jobset.failurePolicy.maxRestarts

How it works. A Job fails at its first failed pod (backoffLimit 0). The Job controller matches the pod
against podFailurePolicy.rules in order, the first match wins; a FailJob rule fails the Job with
reason PodFailurePolicy and one of two messages (Kubernetes pkg/controller/job/pod_failure_policy.go,
matchPodFailurePolicy):
  "Container %s for pod %s/%s failed with exit code %v matching %v rule at index %d"
  "Pod %s/%s has condition %v matching %v rule at index %d"
(container, namespace, pod name, exit code or condition type, action, the rule's index; the format
strings read the same in v1.26 and in current sources). A failed pod no rule matches counts against
backoffLimit: reason BackoffLimitExceeded. The JobSet controller then takes its failurePolicy.rules
in order, and for each the earliest failed Job it applies to: onJobFailureReasons holds the Job's
reason, one of onJobFailureMessagePatterns (RE2, unanchored: Go's regexp match) finds the Job's
message, targetReplicatedJobs names its replicated job (empty: any); the first rule that applies
acts, and when none does the action is RestartJobSet, counted against maxRestarts.
RestartJobSetAndIgnoreMaxRestarts recreates the group without raising restartsCountTowardsMax
(kubernetes-sigs/jobset pkg/controllers/failure_policy.go: findFirstFailedPolicyRuleAndJob,
ruleIsApplicable, failurePolicyRecreateAll; the failure policy docs,
jobset.sigs.k8s.io/docs/tasks/failure_policy, and their host maintenance example; the message
patterns: KEP-262 story 5, PR kubernetes-sigs/jobset#1033, JobSet v0.10.0 and later, and the
controller's integration test that a pattern matches inside a longer message). The reason alone
cannot tell a user error from a disruption: both are PodFailurePolicy. So each rule below matches the
message of exactly one podFailurePolicy rule, by its index, anchored at both ends;
tests/chart/test_failure_policy.py matches the patterns against the messages of every rule.

DisruptionTarget (kubernetes.io, Pod disruption conditions): Kubernetes adds it, status True, before it
deletes a pod for a disruption, with the reason PreemptionByScheduler (the scheduler, Kueue's
preemption through it), DeletionByTaintManager (a NoExecute taint: node not ready, unreachable),
EvictionByEvictionAPI (kubectl drain, the cluster autoscaler, a node upgrade), DeletionByPodGC (the
pod's node no longer exists) or TerminationByKubelet (node-pressure eviction, graceful node shutdown,
preemption for a system-critical pod). `kubectl delete pod`, a drain that deletes instead of evicting,
an OOM kill or a container limit add no condition: those are the other rows of the table above.

Why exit 75 does not count either: a pod that stopped cleanly lost nothing (its checkpoint is the step
it stopped at), and the peers of a disrupted pod stop the same way, with exit 75 and no condition of
their own. Their Jobs can fail before the disrupted pod's Job does, and the JobSet acts on the
failures it sees first: counting exit 75 would count a preemption whenever the master exits first.
The price: something that SIGTERMs the pods again and again without the condition (a script that
deletes pods, a probe that kills the container) restarts the group without bound; each restart
resumes where the last one stopped, and the JobSet's restarts in its status show the loop.
A disrupted pod whose trainer was killed at the end of the grace period (exit 137) still carries the
condition and is not counted; its peers then lose a member and crash (counted, if their Job's failure
is seen first): give terminationGracePeriodSeconds one step plus one checkpoint write, with margin.

Argument: (dict "container" <the training container's name: _pod.tpl's maskrcnn-dist.trainerContainer>
"part" "podFailurePolicy"|"failurePolicyRules"). The exit codes are the launcher's boundary.py
(EXIT_USER_ERROR, EXIT_STOPPED).
*/}}
{{- define "maskrcnn-dist.failurePolicy" -}}
{{- $container := .container -}}
{{- $pattern := "^Container %s for pod [a-z0-9.-]+/[a-z0-9.-]+ failed with exit code %d matching FailJob rule at index %d$" -}}
{{- if eq .part "podFailurePolicy" -}}
rules:
  # 0: a user error.
  - action: FailJob
    onExitCodes:
      containerName: {{ $container }}
      operator: In
      values: [2]
  # 1: a disruption, whatever the trainer exited with (75, or 137 when the grace period ran out).
  - action: FailJob
    onPodConditions:
      - type: DisruptionTarget
        status: "True"
  # 2: a clean stop on SIGTERM (EXIT_STOPPED) without a disruption condition.
  - action: FailJob
    onExitCodes:
      containerName: {{ $container }}
      operator: In
      values: [75]
  # Any other exit counts against backoffLimit 0: the Job fails with reason BackoffLimitExceeded.
{{- else if eq .part "failurePolicyRules" -}}
# In this order: a user error anywhere fails the JobSet even when another Job failed otherwise.
- name: UserError
  action: FailJobSet
  onJobFailureReasons: [PodFailurePolicy]
  onJobFailureMessagePatterns:
    - {{ printf $pattern $container 2 0 | squote }}
- name: Disruption
  action: RestartJobSetAndIgnoreMaxRestarts
  onJobFailureReasons: [PodFailurePolicy]
  onJobFailureMessagePatterns:
    - '^Pod [a-z0-9.-]+/[a-z0-9.-]+ has condition DisruptionTarget matching FailJob rule at index 1$'
- name: StoppedCleanly
  action: RestartJobSetAndIgnoreMaxRestarts
  onJobFailureReasons: [PodFailurePolicy]
  onJobFailureMessagePatterns:
    - {{ printf $pattern $container 75 2 | squote }}
# No rule for the rest (BackoffLimitExceeded): RestartJobSet, counted against maxRestarts.
{{- else -}}
{{- fail (printf "maskrcnn-dist.failurePolicy: part %q is neither podFailurePolicy nor failurePolicyRules" .part) -}}
{{- end -}}
{{- end -}}


{{/* The JobSet's failurePolicy. Argument: (dict "root" $ "container" <the training container's name>). */}}
{{- define "maskrcnn-dist.jobsetFailurePolicy" -}}
maxRestarts: {{ .root.Values.jobset.failurePolicy.maxRestarts }}
restartStrategy: {{ .root.Values.jobset.failurePolicy.restartStrategy }}
rules:
  {{- include "maskrcnn-dist.failurePolicy" (dict "container" .container "part" "failurePolicyRules") | nindent 2 }}
{{- end -}}

{{/* What every replicated Job's spec adds. Argument: (dict "container" <the training container's name>). */}}
{{- define "maskrcnn-dist.jobFailurePolicy" -}}
backoffLimit: 0
podFailurePolicy:
  {{- include "maskrcnn-dist.failurePolicy" (dict "container" .container "part" "podFailurePolicy") | nindent 2 }}
{{- end -}}
