{{/*
The training pod, one definition for every workload (StatefulSets, the JobSet, a Kubeflow TrainJob's
nodes): its labels and annotations, the pod-level settings, and the training container. Its parts live
beside it: the container's image, command and environment in _container.tpl, the volumes and mounts in
_volumes.tpl, the anti-affinity, tolerations and resources in _scheduling.tpl.
*/}}

{{/*
The training pod, for every workload: the StatefulSets' template, the JobSet's Jobs' template and the
Kubeflow training runtime's node template are this one definition. Argument: (dict "root" $ "role"
"master"|"worker" "workload" "statefulset"|"jobset"|"trainjob"), passed on to its parts. A TrainJob's
nodes are all alike: they take the worker's values, mount the volume read-write (node 0 writes the
run) and are labelled component `node`; Kubeflow Trainer fills the container named `node` (PET_*
variables, the TrainJob's image, args and resourcesPerNode).
*/}}
{{- define "maskrcnn-dist.podTemplate" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $jobset := eq .workload "jobset" -}}
{{- $trainjob := eq .workload "trainjob" -}}
{{- $v := index $root.Values $role -}}
metadata:
  labels:
    {{- include "maskrcnn-dist.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ ternary "node" $role $trainjob }}
    {{- with $root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # A changed topology restarts the pods (the launcher reads it once, at start-up).
    checksum/topology: {{ include "maskrcnn-dist.runTopology" $root | sha256sum }}
    {{- with (merge (dict) (default (dict) $v.podAnnotations) (default (dict) $root.Values.podAnnotations)) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- if or $jobset $trainjob }}
  # A Job's pod never restarts in place: a failed pod fails its Job (backoffLimit 0), and the JobSet's
  # failure policy decides what happens to the whole group (jobset.elastic: the workers' Job replaces it).
  restartPolicy: Never
  {{- end }}
  # The trainer never talks to the Kubernetes API: no token, and no Service environment variables
  # (the launcher finds peers through the headless Service's DNS names).
  automountServiceAccountToken: false
  enableServiceLinks: false
  {{- with (include "maskrcnn-dist.serviceAccountName" $root) }}
  serviceAccountName: {{ . }}
  {{- end }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $root.Values.schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  {{- with $root.Values.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  # SIGTERM, then SIGKILL this many seconds later; the trainer reads the same value
  # (MASKRCNN_TERMINATION_GRACE_SECONDS below) to check that a step and a checkpoint write fit.
  terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "maskrcnn-dist.tolerations" .) }}
  tolerations:
    {{- . | nindent 4 }}
  {{- end }}
  {{- $components := ternary (list "node") (list "master" "worker") $trainjob }}
  {{- with (include "maskrcnn-dist.affinity" (dict "root" $root "affinity" $v.affinity "components" $components)) }}
  affinity:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ include "maskrcnn-dist.trainerContainer" .workload }}
      image: {{ include "maskrcnn-dist.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      {{- include "maskrcnn-dist.trainerCommand" . | nindent 6 }}
      {{- include "maskrcnn-dist.trainerEnv" . | nindent 6 }}
      {{- if eq $role "master" }}
      ports:
        - name: rendezvous
          containerPort: {{ $root.Values.network.masterPort }}
          protocol: TCP
      {{- end }}
      {{- with (include "maskrcnn-dist.resources" .) }}
      resources:
        {{- . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.containerSecurityContext | nindent 8 }}
      {{- include "maskrcnn-dist.trainerVolumeMounts" . | nindent 6 }}
  {{- include "maskrcnn-dist.podVolumes" . | nindent 2 }}
{{- end -}}
