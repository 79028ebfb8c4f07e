{{/*
The JobSet failure policy, one definition for every JobSet the chart describes: its own (jobset.yaml)
and the Kubeflow training runtime's JobSet template (trainingruntime.yaml), so that both fail and
restart alike.

- maskrcnn-dist.jobsetFailurePolicy: the JobSet's `failurePolicy` (maxRestarts, restartStrategy, and
  the rules: a Job that failed by its podFailurePolicy fails the JobSet at once).
- maskrcnn-dist.jobFailurePolicy: what every replicated Job's spec adds (backoffLimit 0: any failed pod
  fails its Job; exit code 2, a user error, fails it with the reason PodFailurePolicy). Argument: (dict
  "container" <the training container's name>): `trainer` in the chart's pods, `node` in a TrainJob's
  (Kubeflow Trainer fills the container of that name).
*/}}
{{- define "maskrcnn-dist.jobsetFailurePolicy" -}}
maxRestarts: {{ .Values.jobset.failurePolicy.maxRestarts }}
restartStrategy: {{ .Values.jobset.failurePolicy.restartStrategy }}
rules:
  # A user error is not retried: the podFailurePolicy below turns exit code 2 into the Job
  # failure reason PodFailurePolicy.
  - name: UserError
    action: FailJobSet
    onJobFailureReasons:
      - PodFailurePolicy
{{- end -}}

{{- define "maskrcnn-dist.jobFailurePolicy" -}}
backoffLimit: 0
podFailurePolicy:
  rules:
    - action: FailJob
      onExitCodes:
        containerName: {{ .container }}
        operator: In
        values: [2]
{{- end -}}
