{{/*
What a JobSet does when a training pod fails, in one place: the podFailurePolicy of every replicated
Job and the rules of the JobSet's failurePolicy, which read what the first one writes. The chart's
JobSet (jobset.yaml) and the Kubeflow training runtime's JobSet template (trainingruntime.yaml)
include maskrcnn-dist.jobsetFailurePolicy and maskrcnn-dist.jobFailurePolicy below, so they follow
the same rules. What they mean, why, and the Job and JobSet sources they follow are described once,
in docs/deploy-kubernetes.md, "What a JobSet counts"; change that page together with these rules.
Each JobSet rule matches the Job controller's message of exactly one podFailurePolicy rule, by its
index, anchored at both ends (tests/chart/test_failure_policy.py checks them against those messages).

Argument: (dict "container" <the training container's name: _container.tpl's maskrcnn-dist.trainerContainer>
"part" "podFailurePolicy"|"failurePolicyRules" ["elastic" true]). The exit codes are the launcher's
boundary.py (EXIT_USER_ERROR, EXIT_STOPPED). With "elastic" (the workers' Job of jobset.elastic) a
disruption and a clean stop are Ignore instead of FailJob: the Job replaces that pod alone and counts
nothing; the rules keep their indexes, so the user error's message is the same.
*/}}
{{- define "maskrcnn-dist.failurePolicy" -}}
{{- $container := .container -}}
{{- $replaced := ternary "Ignore" "FailJob" (.elastic | default false) -}}
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
  - action: {{ $replaced }}
    onPodConditions:
      - type: DisruptionTarget
        status: "True"
  # 2: a clean stop on SIGTERM (EXIT_STOPPED) without a disruption condition (elastic: a drained worker).
  - action: {{ $replaced }}
    onExitCodes:
      containerName: {{ $container }}
      operator: In
      values: [75]
  # Any other exit counts against backoffLimit (0; elastic workers: workerReplacements): past it the
  # Job fails with reason BackoffLimitExceeded.
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

{{/*
What every replicated Job's spec adds. Argument: (dict "container" <the training container's name>
["elastic" true "replacements" N]). Elastic (the workers' Job of jobset.elastic): a failed pod is
replaced under its completion index, once it has terminated (podReplacementPolicy Failed, the only
value podFailurePolicy allows): the old trainer is gone before its replacement asks to join.
*/}}
{{- define "maskrcnn-dist.jobFailurePolicy" -}}
{{- if .elastic }}
backoffLimit: {{ .replacements }}
podReplacementPolicy: Failed
{{- else }}
backoffLimit: 0
{{- end }}
podFailurePolicy:
  {{- include "maskrcnn-dist.failurePolicy" (dict "container" .container "part" "podFailurePolicy" "elastic" .elastic) | nindent 2 }}
{{- end -}}
