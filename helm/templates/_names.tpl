{{/*
Names and labels of the release's objects: the fullname every object name starts with, the chart's
labels and the selectors, the names of the StatefulSets, the headless Service, the topology
ConfigMap and the claim, the JobSet's replicated jobs, and the master's host name and DNS address
(the names the launcher derives too: maskrcnn_launcher.contract).

Object names are capped at 63 characters minus room for the suffixes the chart and Kubernetes add
("-worker", "-<ordinal>", the StatefulSet's controller-revision hash label), so the prefix is capped
at 40.
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

{{/*
The JobSet's replicated job of a role: `master` (1 pod) and `workers` (one Indexed Job of N pods). The
launcher maps them back (maskrcnn_launcher.contract): replicated job `workers`, completion index i is
worker i.
*/}}
{{- define "maskrcnn-dist.replicatedJob" -}}
{{- ternary "master" "workers" (eq . "master") -}}
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

{{/*
The Job the JobSet makes of a role's replicated job: <jobset>-<replicated job>-<job index> (one Job per
replicated job, index 0; the JobSet is <fullname>). Argument: (dict "root" $ "role" "master"|"worker").
*/}}
{{- define "maskrcnn-dist.jobName" -}}
{{- printf "%s-%s-0" (include "maskrcnn-dist.fullname" .root) (include "maskrcnn-dist.replicatedJob" .role) -}}
{{- end -}}

{{/*
The master's host name: the StatefulSet pod <fullname>-master-0, or the JobSet pod <jobset>-master-0-0
(its Job's name, then the completion index).
*/}}
{{- define "maskrcnn-dist.masterHost" -}}
{{- if eq (include "maskrcnn-dist.workload" .) "jobset" -}}
{{- printf "%s-0" (include "maskrcnn-dist.jobName" (dict "root" . "role" "master")) -}}
{{- else -}}
{{- printf "%s-0" (include "maskrcnn-dist.masterName" .) -}}
{{- end -}}
{{- end -}}

{{/* The master's stable DNS name (what the launcher derives too; used by the helm test). */}}
{{- define "maskrcnn-dist.masterAddress" -}}
{{- printf "%s.%s.%s.svc.%s" (include "maskrcnn-dist.masterHost" .) (include "maskrcnn-dist.headlessService" .) .Release.Namespace .Values.network.clusterDomain -}}
{{- end -}}

{{/*
The example TrainJob's name (kubeflowTrainer.trainJob.name, else the fullname): its JobSet, its
subdomain and the prefix of its nodes' host names `<name>-node-0-<rank>` (maskrcnn_launcher.contract).
*/}}
{{- define "maskrcnn-dist.trainJobName" -}}
{{- default (include "maskrcnn-dist.fullname" .) .Values.kubeflowTrainer.trainJob.name -}}
{{- end -}}

{{/* The ServiceAccount the pods run as; empty: the namespace's default (no serviceAccountName). */}}
{{- define "maskrcnn-dist.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "maskrcnn-dist.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}
