{{/*
Names and labels. Object names are capped at 63 characters minus room for the suffixes the chart
and Kubernetes add ("-worker", "-<ordinal>", the StatefulSet's controller-revision hash label), so
the prefix is capped at 40.
*/}}
{{- define "maskrcnn-dist.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "maskrcnn-dist.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "maskrcnn-dist.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: the release's pods (master, workers, test pod) share these. */}}
{{- define "maskrcnn-dist.selectorLabels" -}}
app.kubernetes.io/name: {{ include "maskrcnn-dist.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "maskrcnn-dist.labels" -}}
helm.sh/chart: {{ include "maskrcnn-dist.chart" . }}
{{ include "maskrcnn-dist.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: maskrcnn-dist
{{- end -}}

{{/* The names the launcher relies on: StatefulSets <fullname>-master / <fullname>-worker. */}}
{{- define "maskrcnn-dist.masterName" -}}
{{- printf "%s-master" (include "maskrcnn-dist.fullname" .) -}}
{{- end -}}
{{- define "maskrcnn-dist.workerName" -}}
{{- printf "%s-worker" (include "maskrcnn-dist.fullname" .) -}}
{{- end -}}
{{- define "maskrcnn-dist.headlessService" -}}
{{- printf "%s-headless" (include "maskrcnn-dist.fullname" .) -}}
{{- end -}}
{{- define "maskrcnn-dist.topologyConfigMap" -}}
{{- printf "%s-topology" (include "maskrcnn-dist.fullname" .) -}}
{{- end -}}
{{- define "maskrcnn-dist.claimName" -}}
{{- default (printf "%s-data" (include "maskrcnn-dist.fullname" .)) .Values.storage.existingClaim -}}
{{- end -}}

{{/* The master's stable DNS name (what the launcher derives too; used by the helm test). */}}
{{- define "maskrcnn-dist.masterAddress" -}}
{{- printf "%s-0.%s.%s.svc.%s" (include "maskrcnn-dist.masterName" .) (include "maskrcnn-dist.headlessService" .) .Release.Namespace .Values.network.clusterDomain -}}
{{- end -}}

{{- define "maskrcnn-dist.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where the topology ConfigMap is mounted, and the file the launcher reads. */}}
{{- define "maskrcnn-dist.topologyDir" -}}/etc/maskrcnn{{- end -}}
{{- define "maskrcnn-dist.topologyPath" -}}{{ include "maskrcnn-dist.topologyDir" . }}/topology.yaml{{- end -}}

{{/* Number of worker pods: one per stage for the pipeline engine, ddp.workers for ddp. */}}
{{- define "maskrcnn-dist.workerCount" -}}
{{- if eq .Values.engine "pipeline" -}}
{{- len .Values.pipeline.stages -}}
{{- else -}}
{{- .Values.ddp.workers -}}
{{- end -}}
{{- end -}}

{{/*
Cross-field checks the JSON schema cannot express; each message names the values to change.
Included once from the ConfigMap so it runs on every render.
*/}}
{{- define "maskrcnn-dist.validate" -}}
{{- if and (eq .Values.engine "pipeline") (gt (int .Values.master.gpus) 0) -}}
{{- fail "master.gpus must be 0 with engine=pipeline: the pipeline master holds the data loader and the optimizer, not a model stage; give the GPUs to worker.gpus" -}}
{{- end -}}
{{- if and (eq .Values.engine "ddp") (ne (gt (int .Values.master.gpus) 0) (gt (int .Values.worker.gpus) 0)) -}}
{{- fail "engine=ddp needs master.gpus and worker.gpus both > 0 or both 0: one process-group backend (nccl or gloo) for every pod" -}}
{{- end -}}
{{- if gt (int .Values.networkPolicy.peerPorts.from) (int .Values.networkPolicy.peerPorts.to) -}}
{{- fail (printf "networkPolicy.peerPorts: from (%v) must not exceed to (%v)" .Values.networkPolicy.peerPorts.from .Values.networkPolicy.peerPorts.to) -}}
{{- end -}}
{{- if and (eq .Values.engine "ddp") (eq .Values.storage.workerMount "none") -}}
{{- fail "storage.workerMount=none with engine=ddp: every ddp pod reads the dataset; use auto or readOnly" -}}
{{- end -}}
{{- end -}}

{{/* How workers mount the volume: none | readOnly | readWrite (resolves `auto`). */}}
{{- define "maskrcnn-dist.workerMounts" -}}
{{- if eq .Values.storage.workerMount "auto" -}}
{{- if eq .Values.engine "ddp" -}}readOnly{{- else -}}none{{- end -}}
{{- else -}}
{{- .Values.storage.workerMount -}}
{{- end -}}
{{- end -}}

{{/*
The topology the launcher reads (format: launcher/maskrcnn_launcher/topology.py). GPU counts come
from master.gpus / worker.gpus, the same values that render the nvidia.com/gpu limits.
*/}}
{{- define "maskrcnn-dist.topology" -}}
{{- $workers := list -}}
{{- if eq .Values.engine "pipeline" -}}
{{- range .Values.pipeline.stages -}}
{{- $workers = append $workers (dict "devices" (int $.Values.worker.gpus) "stage" .name "replicas" (int (default 1 .replicas))) -}}
{{- end -}}
{{- else -}}
{{- range until (int .Values.ddp.workers) -}}
{{- $workers = append $workers (dict "devices" (int $.Values.worker.gpus)) -}}
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
{{- if .Values.estimate -}}
{{- $_ := set $topology "estimate" .Values.estimate -}}
{{- end -}}
{{- toYaml $topology -}}
{{- end -}}

{{/*
Anti-affinity that keeps every training pod of the release on its own node (spreadAcrossNodes),
matched on the component label so the helm test pod neither blocks nor is blocked by it; merged
into the role's own affinity. Argument: (dict "root" $ "affinity" <role affinity>).
*/}}
{{- define "maskrcnn-dist.affinity" -}}
{{- $affinity := deepCopy (default (dict) .affinity) -}}
{{- if .root.Values.spreadAcrossNodes -}}
{{- $anti := default (dict) (get $affinity "podAntiAffinity") -}}
{{- $required := default (list) (get $anti "requiredDuringSchedulingIgnoredDuringExecution") -}}
{{- $roles := dict "key" "app.kubernetes.io/component" "operator" "In" "values" (list "master" "worker") -}}
{{- $selector := dict "matchLabels" (include "maskrcnn-dist.selectorLabels" .root | fromYaml) "matchExpressions" (list $roles) -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" $selector -}}
{{- $_ := set $anti "requiredDuringSchedulingIgnoredDuringExecution" (append $required $term) -}}
{{- $_ := set $affinity "podAntiAffinity" $anti -}}
{{- end -}}
{{- if $affinity -}}
{{- toYaml $affinity -}}
{{- end -}}
{{- end -}}
