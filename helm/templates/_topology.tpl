{{/*
The job's shape: the workload (StatefulSets or a JobSet), the number of worker pods, and the
topology the launcher reads (the ConfigMap), rendered from the same values as the pods.
*/}}

{{/*
The workload the release renders: `statefulset` or `jobset`. `auto` asks the cluster (or
`helm template --api-versions jobset.x-k8s.io/v1alpha2`) whether it serves the JobSet API.
`trainjob` when kubeflowTrainer.runtime.enabled: the release is a Kubeflow training runtime, and its
TrainJobs' JobSets are the training pods (the release renders no StatefulSet, JobSet or Service).
`inspect` when inspect.enabled: the release is the volume and one idle pod on it (inspect.yaml), no
training.
*/}}
{{- define "maskrcnn-dist.workload" -}}
{{- if .Values.inspect.enabled -}}
inspect
{{- else if .Values.kubeflowTrainer.runtime.enabled -}}
trainjob
{{- else if eq .Values.workload "auto" -}}
{{- ternary "jobset" "statefulset" (.Capabilities.APIVersions.Has "jobset.x-k8s.io/v1alpha2") -}}
{{- else -}}
{{- .Values.workload -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the release runs its own training pods (StatefulSets or a JobSet), which the headless
Service, the NetworkPolicy and the helm test serve; empty for a Kubeflow runtime or an inspect release.
*/}}
{{- define "maskrcnn-dist.ownPods" -}}
{{- if has (include "maskrcnn-dist.workload" .) (list "statefulset" "jobset") -}}true{{- end -}}
{{- end -}}

{{/* Number of worker pods: one per stage for the pipeline engine, ddp.workers for ddp. */}}
{{- define "maskrcnn-dist.workerCount" -}}
{{- if eq .Values.engine "pipeline" -}}
{{- len .Values.pipeline.stages -}}
{{- else -}}
{{- .Values.ddp.workers -}}
{{- end -}}
{{- end -}}

{{/*
The topology the launcher reads (format: launcher/maskrcnn_launcher/topology.py). GPU counts come
from master.gpus / worker.gpus, the same values that render the GPU limits.
*/}}
{{- define "maskrcnn-dist.topology" -}}
{{- include "maskrcnn-dist.topologyYaml" (dict "root" . "estimate" true) -}}
{{- end -}}

{{/*
What the pods' checksum/topology annotation hashes: the topology without `estimate`, which only
feeds the printed plan, so changing it restarts no pod.
*/}}
{{- define "maskrcnn-dist.runTopology" -}}
{{- include "maskrcnn-dist.topologyYaml" (dict "root" . "estimate" false) -}}
{{- end -}}

{{- define "maskrcnn-dist.topologyYaml" -}}
{{- $withEstimate := .estimate -}}
{{- $root := .root -}}
{{- with .root -}}
{{- $workers := list -}}
{{- if eq .Values.engine "pipeline" -}}
{{- range .Values.pipeline.stages -}}
{{- $workers = append $workers (dict "devices" (int $root.Values.worker.gpus) "stage" .name "replicas" (int (default 1 .replicas))) -}}
{{- end -}}
{{- else -}}
{{- range until (int .Values.ddp.workers) -}}
{{- $workers = append $workers (dict "devices" (int $root.Values.worker.gpus)) -}}
{{- end -}}
{{- end -}}
{{- $network := dict "master_port" (int .Values.network.masterPort) -}}
{{- if .Values.network.interface -}}
{{- $_ := set $network "interface" .Values.network.interface -}}
{{- end -}}
{{- $topology := dict "engine" .Values.engine "master" (dict "devices" (int .Values.master.gpus)) "workers" $workers "network" $network -}}
{{- if eq .Values.engine "pipeline" -}}
{{- $_ := set $network "transport" .Values.pipeline.transport -}}
{{- $stages := list -}}
{{- range .Values.pipeline.stages -}}
{{- $stages = append $stages (dict "name" .name "modules" .modules) -}}
{{- end -}}
{{- $_ := set $topology "stages" $stages -}}
{{- end -}}
{{- if $withEstimate -}}
{{- with include "maskrcnn-dist.estimate" $root | fromYaml -}}
{{- $_ := set $topology "estimate" . -}}
{{- end -}}
{{- end -}}
{{- toYaml $topology -}}
{{- end -}}
{{- end -}}

{{/*
The estimate keys a trainer flag decides: a values file states the batch and the micro-batch count
once, in trainer.args, and the topology's estimate takes them from there.
*/}}
{{- define "maskrcnn-dist.estimateFlags" -}}
{{- toYaml (dict "batch_size" "--batch-size" "micro_batches" "--micro-batches") -}}
{{- end -}}

{{/*
The value of a trainer flag in trainer.args, `--flag VALUE` or `--flag=VALUE` (the last one wins, as
on the trainer's command line), each argument rendered with tpl as the pod gets it; empty when the
flag is not there. Argument: (dict "root" $ "flag" "--batch-size").
*/}}
{{- define "maskrcnn-dist.trainerFlag" -}}
{{- $root := .root -}}
{{- $flag := .flag -}}
{{- $args := list -}}
{{- range $root.Values.trainer.args -}}
{{- $args = append $args (tpl (toString .) $root) -}}
{{- end -}}
{{- $value := "" -}}
{{- range $i, $arg := $args -}}
{{- if and (eq $arg $flag) (lt (add1 $i) (len $args)) -}}
{{- $value = index $args (add1 $i) -}}
{{- else if hasPrefix (printf "%s=" $flag) $arg -}}
{{- $value = trimPrefix (printf "%s=" $flag) $arg -}}
{{- end -}}
{{- end -}}
{{- $value -}}
{{- end -}}

{{/*
The topology's `estimate` (YAML; empty when there is none): the values' estimate, with batch_size
and micro_batches taken from trainer.args (estimateFlags) where estimate does not give them.
validateEstimate refuses an estimate that gives them otherwise than trainer.args.
*/}}
{{- define "maskrcnn-dist.estimate" -}}
{{- $estimate := deepCopy (default (dict) .Values.estimate) -}}
{{- range $key, $flag := include "maskrcnn-dist.estimateFlags" . | fromYaml -}}
{{- $value := include "maskrcnn-dist.trainerFlag" (dict "root" $ "flag" $flag) -}}
{{- if and $value (not (hasKey $estimate $key)) -}}
{{- $_ := set $estimate $key (atoi $value) -}}
{{- end -}}
{{- end -}}
{{- with $estimate -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}
