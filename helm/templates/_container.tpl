{{/*
The training container's parts that are not the pod's: its image and name, what it runs (the launcher,
then the trainer's arguments) and its environment (the launcher's contract). _pod.tpl puts them
together; every template here but image and trainerContainer takes the pod template's argument,
(dict "root" $ "role" "master"|"worker" "workload" "statefulset"|"jobset"|"trainjob").
*/}}

{{/* The image the pods run: repository@digest when a digest is set, else repository:tag (default appVersion). */}}
{{- define "maskrcnn-dist.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The training container's name: the JobSet's podFailurePolicy rules name it (_failure_policy.tpl).
Kubeflow Trainer fills the container named `node` of a TrainJob's pods. Argument: the workload.
*/}}
{{- define "maskrcnn-dist.trainerContainer" -}}{{ ternary "node" "trainer" (eq . "trainjob") }}{{- end -}}

{{/* The trainer's arguments: trainer.data's flags, then trainer.args (each rendered with tpl), then --elastic
with jobset.elastic (the trainers go on without a lost worker), as YAML list items. */}}
{{- define "maskrcnn-dist.trainerArgs" -}}
{{- $dataArgs := concat (include "maskrcnn-dist.dataArgs" . | fromYamlArray) (include "maskrcnn-dist.cacheArgs" . | fromYamlArray) -}}
{{- $elasticArgs := ternary (list "--elastic") list .Values.jobset.elastic.enabled -}}
{{- range $i, $arg := concat $dataArgs .Values.trainer.args $elasticArgs }}
{{- if $i }}{{ "\n" }}{{ end }}- {{ tpl (toString $arg) $ | quote }}
{{- end -}}
{{- end -}}

{{/* trainer.data key -> the trainer flag it sets (the split flags of `maskrcnn-dist train --help`). */}}
{{- define "maskrcnn-dist.dataFlags" -}}
path: --data-path
trainAnnotations: --train-annotations
trainImages: --train-images
valAnnotations: --val-annotations
valImages: --val-images
valFraction: --val-fraction
crowdAsInstances: --crowd-as-instances
{{- end -}}

{{/*
trainer.data.cache as --data-cache, a YAML list. Kept apart from dataFlags: where the parsed data is
cached names no data, so it neither makes `path` give way nor clashes with a data flag in trainer.args.
*/}}
{{- define "maskrcnn-dist.cacheArgs" -}}
{{- $cache := (.Values.trainer.data | default dict).cache -}}
{{- toYaml (ternary (list "--data-cache" (toString $cache)) list (not (kindIs "invalid" $cache))) -}}
{{- end -}}

{{/*
trainer.data as trainer flags, a YAML list (in the order of dataFlags' keys, sorted). `path` (default
/data/coco) gives way to a split file or folder named here or a data flag in trainer.args, so that
either one names the data without unsetting the default.
*/}}
{{- define "maskrcnn-dist.dataArgs" -}}
{{- $data := .Values.trainer.data | default dict -}}
{{- $named := false -}}
{{- range $key := list "trainAnnotations" "trainImages" "valAnnotations" "valImages" -}}
{{- if not (kindIs "invalid" (index $data $key)) }}{{ $named = true }}{{ end -}}
{{- end -}}
{{- $sourceFlags := list "--data-path" "--train-annotations" "--train-images" "--val-annotations" "--val-images" -}}
{{- range .Values.trainer.args -}}
{{- if has (regexReplaceAll "=.*$" (toString .) "") $sourceFlags }}{{ $named = true }}{{ end -}}
{{- end -}}
{{- $args := list -}}
{{- range $key, $flag := include "maskrcnn-dist.dataFlags" . | fromYaml -}}
{{- $value := ternary (index $data $key) nil (hasKey $data $key) -}}
{{- if and (eq $key "path") $named -}}
{{- else if eq $key "crowdAsInstances" -}}
{{- if $value }}{{ $args = append $args $flag }}{{ end -}}
{{- else if not (kindIs "invalid" $value) -}}
{{- $args = concat $args (list $flag (toString $value)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/*
The container's `command` (a TrainJob's node only) and `args`: the launcher's `launch --topology ... --`,
then the trainer's arguments. YAML keys of the container, to be indented under it.
*/}}
{{- define "maskrcnn-dist.trainerCommand" -}}
{{- if eq .workload "trainjob" -}}
# Kubeflow Trainer replaces `args` with the TrainJob's spec.trainer.args, so the launcher is the
# command (under dumb-init, as the image's entrypoint runs it) and a TrainJob's args are the
# trainer's. The launcher reads the node from PET_* (Trainer's torch plugin sets them), checks
# them against the topology, waits for node 0, then execs the trainer under torchrun.
command:
  - dumb-init
  - --
  - maskrcnn-launch
  - launch
  - --topology
  - $(MASKRCNN_TOPOLOGY)
  - --
args:
{{- else -}}
# The image's entrypoint (dumb-init -> maskrcnn-launch) gets these arguments; the launcher
# turns the topology and the pod identity below into rank, world size and MASTER_ADDR/PORT,
# waits for the master, then execs the trainer with everything after `--`.
args:
  - launch
  - --topology
  - $(MASKRCNN_TOPOLOGY)
  - --
{{- end }}
  {{- with (include "maskrcnn-dist.trainerArgs" .root) }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/*
The container's `env`: the pod's identity as the launcher's environment contract names it
(maskrcnn_launcher.contract: the StatefulSets' and JobSet's pods, or a TrainJob's node, whose identity
is Trainer's PET_*), then the user's extraEnv. A YAML key of the container, to be indented under it.
*/}}
{{- define "maskrcnn-dist.trainerEnv" -}}
{{- $root := .root -}}
{{- if eq .workload "trainjob" -}}
# Exactly the variables maskrcnn_launcher.contract.TRAINJOB_POD_ENV_VARS and TRAINER_READ_VARS name
# (the node comes from Trainer's PET_*; a chart test checks it), then the user's extraEnv.
{{- else -}}
# Exactly the variables maskrcnn_launcher.contract.POD_ENV_VARS and TRAINER_READ_VARS name (a
# chart test checks it), then the user's extraEnv.
{{- end }}
env:
  - name: MASKRCNN_TOPOLOGY
    value: {{ include "maskrcnn-dist.topologyPath" $root | quote }}
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  {{- if ne .workload "trainjob" }}
  - name: MASKRCNN_HEADLESS_SERVICE
    value: {{ include "maskrcnn-dist.headlessService" $root | quote }}
  - name: MASKRCNN_CLUSTER_DOMAIN
    value: {{ $root.Values.network.clusterDomain | quote }}
  {{- end }}
  # The pod's terminationGracePeriodSeconds, one value: the trainer's budget for stopping at a
  # step boundary with a checkpoint after SIGTERM (contract.TERMINATION_GRACE_SECONDS).
  - name: MASKRCNN_TERMINATION_GRACE_SECONDS
    value: {{ $root.Values.terminationGracePeriodSeconds | quote }}
  {{- if eq .workload "jobset" }}
  # JobSet pods (contract.JOBSET_POD_ENV_VARS): the JobSet and Job controllers' labels and
  # annotations name the replicated job and the index; the host name is the launcher's fallback.
  - name: MASKRCNN_JOBSET_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.labels['jobset.sigs.k8s.io/jobset-name']
  - name: MASKRCNN_REPLICATED_JOB
    valueFrom:
      fieldRef:
        fieldPath: metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']
  - name: MASKRCNN_JOB_INDEX
    valueFrom:
      fieldRef:
        fieldPath: metadata.labels['jobset.sigs.k8s.io/job-index']
  - name: MASKRCNN_COMPLETION_INDEX
    valueFrom:
      fieldRef:
        fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']
  {{- end }}
  {{- with $root.Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
