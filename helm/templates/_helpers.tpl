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

{{/*
The workload the release renders: `statefulset` or `jobset`. `auto` asks the cluster (or
`helm template --api-versions jobset.x-k8s.io/v1alpha2`) whether it serves the JobSet API.
*/}}
{{- define "maskrcnn-dist.workload" -}}
{{- if eq .Values.workload "auto" -}}
{{- ternary "jobset" "statefulset" (.Capabilities.APIVersions.Has "jobset.x-k8s.io/v1alpha2") -}}
{{- else -}}
{{- .Values.workload -}}
{{- end -}}
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
The master's host name: the StatefulSet pod <fullname>-master-0, or the JobSet pod
<jobset>-master-0-0 (<jobset>-<replicated job>-<job index>-<completion index>; the JobSet is <fullname>).
*/}}
{{- define "maskrcnn-dist.masterHost" -}}
{{- if eq (include "maskrcnn-dist.workload" .) "jobset" -}}
{{- printf "%s-%s-0-0" (include "maskrcnn-dist.fullname" .) (include "maskrcnn-dist.replicatedJob" "master") -}}
{{- else -}}
{{- printf "%s-0" (include "maskrcnn-dist.masterName" .) -}}
{{- end -}}
{{- end -}}

{{/* The master's stable DNS name (what the launcher derives too; used by the helm test). */}}
{{- define "maskrcnn-dist.masterAddress" -}}
{{- printf "%s.%s.%s.svc.%s" (include "maskrcnn-dist.masterHost" .) (include "maskrcnn-dist.headlessService" .) .Release.Namespace .Values.network.clusterDomain -}}
{{- end -}}

{{- define "maskrcnn-dist.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the pods run as; empty: the namespace's default (no serviceAccountName). */}}
{{- define "maskrcnn-dist.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "maskrcnn-dist.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
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
{{- include "maskrcnn-dist.validateNames" . -}}
{{- include "maskrcnn-dist.validateMetadata" . -}}
{{- include "maskrcnn-dist.validateTopology" . -}}
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
{{- if and (eq .Values.engine "pipeline") (eq .Values.pipeline.transport "device_maps") (eq (int .Values.worker.gpus) 0) -}}
{{- fail "pipeline.transport=device_maps needs GPUs: worker.gpus is 0, and TensorPipe device maps move CUDA tensors between GPUs; use pipeline.transport=cpu on CPU" -}}
{{- end -}}
{{- range $role := list "master" "worker" -}}
{{- $resources := default (dict) (index $.Values $role).resources -}}
{{- range $section := list "requests" "limits" -}}
{{- range $name, $_ := default (dict) (get $resources $section) -}}
{{- if or (eq $name $.Values.gpuResourceName) (hasPrefix "nvidia.com/" $name) (hasPrefix "amd.com/" $name) (hasPrefix "gpu.intel.com/" $name) -}}
{{- fail (printf "%s.resources.%s.%s is set by hand: the chart renders the GPU limit from %s.gpus (the same value gives the topology's device count, so the two cannot disagree); set %s.gpus (and gpuResourceName) instead" $role $section $name $role $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $i, $env := .Values.extraEnv -}}
{{- if and (hasKey $env "value") (hasKey $env "valueFrom") -}}
{{- fail (printf "extraEnv[%d] (%s) has both value and valueFrom: give one of them" $i $env.name) -}}
{{- end -}}
{{- if or (has $env.name (include "maskrcnn-dist.contractEnv" $ | fromYamlArray)) (and (hasPrefix "MASKRCNN_" $env.name) (not (has $env.name (include "maskrcnn-dist.userEnv" $ | fromYamlArray)))) -}}
{{- fail (printf "extraEnv[%d].name=%s: %s belongs to the launcher's environment contract (maskrcnn_launcher.contract): the chart sets the pod's identity and the launcher exports the rank and the master's address; remove it from extraEnv (for the socket interface set network.interface)" $i $env.name $env.name) -}}
{{- end -}}
{{- end -}}
{{- include "maskrcnn-dist.validateVolumes" . -}}
{{- $estimate := default (dict) .Values.estimate -}}
{{- $batch := int (default 2 $estimate.batch_size) -}}
{{- if and (hasKey $estimate "micro_batches") (gt (int $estimate.micro_batches) $batch) -}}
{{- fail (printf "estimate.micro_batches (%v) exceeds estimate.batch_size (%d): the launcher would refuse the topology and no pod would start, although estimate only feeds the printed plan; the run's micro-batches are the trainer's --micro-batches" $estimate.micro_batches $batch) -}}
{{- end -}}
{{- end -}}

{{/*
The variables of the launcher's environment contract a user must not set through extraEnv (besides
every MASKRCNN_* but MASKRCNN_WAIT_TIMEOUT and MASKRCNN_TRAINER_CMD): the pod's identity, set by the
chart or the kubelet, and what the launcher exports. A chart test compares it with
maskrcnn_launcher.contract.
*/}}
{{- define "maskrcnn-dist.contractEnv" -}}
{{- toYaml (list "POD_NAME" "HOSTNAME" "POD_NAMESPACE" "POD_IP" "MASTER_ADDR" "MASTER_PORT" "RANK" "WORLD_SIZE" "LOCAL_RANK" "LOCAL_WORLD_SIZE" "TP_SOCKET_IFNAME" "GLOO_SOCKET_IFNAME" "NCCL_SOCKET_IFNAME") -}}
{{- end -}}

{{/*
The MASKRCNN_* variables a user may set through extraEnv (maskrcnn_launcher.contract.USER_ENV_VARS; a
chart test compares the two): the launcher's wait for the master, its trainer command, and the
tracebacks of every entry point (MASKRCNN_DEBUG). Every other MASKRCNN_* is the pod's identity.
*/}}
{{- define "maskrcnn-dist.userEnv" -}}
{{- toYaml (list "MASKRCNN_WAIT_TIMEOUT" "MASKRCNN_TRAINER_CMD" "MASKRCNN_DEBUG") -}}
{{- end -}}

{{/*
Object names: every name starts with the fullname, and the headless Service (and a JobSet's Jobs, its
pods' host names and its subdomain, which the JobSet webhook checks) must be DNS-1035 labels: a
lower-case letter first. A release called `1run` or `my.run` would render, then be refused by the API
server (the Service) or the JobSet webhook.
*/}}
{{- define "maskrcnn-dist.validateNames" -}}
{{- $fullname := include "maskrcnn-dist.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $fullname) -}}
{{- $source := ternary (printf "fullnameOverride=%s" .Values.fullnameOverride) (printf "the release name %s" .Release.Name) (ne .Values.fullnameOverride "") -}}
{{- fail (printf "%s gives object names starting with %q, which is not a DNS-1035 label (a lower-case letter first, then lower-case letters, digits and '-'): the headless Service and the JobSet's Jobs and pod host names must be; choose a release name that starts with a letter, or set fullnameOverride" $source $fullname) -}}
{{- end -}}
{{- end -}}

{{/*
Labels and annotations the chart or the controllers own on the training pods: podLabels and the
podAnnotations may not set them (the rendered YAML would hold the key twice, or a selector, the
topology checksum or the JobSet identity the launcher reads would change).
*/}}
{{- define "maskrcnn-dist.validateMetadata" -}}
{{- $chartLabels := include "maskrcnn-dist.labels" . | fromYaml | keys -}}
{{- $launcherKeys := list "jobset.sigs.k8s.io/jobset-name" "jobset.sigs.k8s.io/replicatedjob-name" "jobset.sigs.k8s.io/job-index" "batch.kubernetes.io/job-completion-index" -}}
{{- $ownedLabels := concat $chartLabels (list "app.kubernetes.io/component") $launcherKeys -}}
{{- $ownedAnnotations := concat (list "checksum/topology") $launcherKeys -}}
{{- range $key, $_ := .Values.podLabels -}}
{{- if has $key $ownedLabels -}}
{{- fail (printf "podLabels.%s: the chart sets this label itself (%s): choose another key" $key (join ", " (sortAlpha $ownedLabels))) -}}
{{- end -}}
{{- end -}}
{{- range $where := list "podAnnotations" "master.podAnnotations" "worker.podAnnotations" -}}
{{- $annotations := ternary $.Values.podAnnotations (index $.Values (first (splitList "." $where))).podAnnotations (eq $where "podAnnotations") -}}
{{- range $key, $_ := $annotations -}}
{{- if has $key $ownedAnnotations -}}
{{- fail (printf "%s.%s: the chart or the JobSet controller sets this annotation itself (%s): choose another key" $where $key (join ", " (sortAlpha $ownedAnnotations))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The launcher's topology rules (maskrcnn_launcher.topology) on the values that render the topology, so
a topology the launcher would refuse (every pod exiting 2 at start-up) is refused here, naming the
value. A chart test renders a table of pipelines and checks that the chart and the launcher agree.
*/}}
{{- define "maskrcnn-dist.validateTopology" -}}
{{- if eq .Values.engine "pipeline" -}}
{{- $modules := list "transform" "backbone" "rpn" "roi_heads" -}}
{{- $parameterless := list "transform" -}}
{{- $placed := list -}}
{{- $names := list -}}
{{- $gpus := int .Values.worker.gpus -}}
{{- range $i, $stage := .Values.pipeline.stages -}}
{{- if has $stage.name $names -}}
{{- fail (printf "pipeline.stages[%d].name=%s: another stage has this name; stage names must be unique" $i $stage.name) -}}
{{- end -}}
{{- $names = append $names $stage.name -}}
{{- $placed = concat $placed $stage.modules -}}
{{- if not (without $stage.modules "transform") -}}
{{- fail (printf "pipeline.stages[%d].modules=[%s]: only %s, which has no parameters to train; put it in one stage with the module after it" $i (join ", " $stage.modules) (join ", " $parameterless)) -}}
{{- end -}}
{{- $replicas := int (default 1 $stage.replicas) -}}
{{- if and (gt $gpus 0) (gt $replicas $gpus) -}}
{{- fail (printf "pipeline.stages[%d].replicas=%d: more replicas than worker.gpus (%d); each replica runs on its own GPU" $i $replicas $gpus) -}}
{{- end -}}
{{- end -}}
{{- if ne (join "," $placed) (join "," $modules) -}}
{{- fail (printf "pipeline.stages: the modules in stage order are [%s]; the stages must split [%s] into contiguous runs in this order, each module in exactly one stage" (join ", " $placed) (join ", " $modules)) -}}
{{- end -}}
{{- if and (eq .Values.pipeline.transport "device_maps") (gt $gpus 0) -}}
{{- $stages := .Values.pipeline.stages -}}
{{- range $i := until (sub (len $stages) 1 | int) -}}
{{- $this := int (default 1 (index $stages $i).replicas) -}}
{{- $next := int (default 1 (index $stages (add1 $i)).replicas) -}}
{{- if gt $this $next -}}
{{- fail (printf "pipeline.stages[%d].replicas=%d is below pipeline.stages[%d].replicas=%d with pipeline.transport=device_maps: device maps are one-to-one, so every replica's GPU of a stage needs its own landing GPU on the next stage; give it more replicas, or use pipeline.transport=cpu" (add1 $i) $next $i $this) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
extraVolumes and extraVolumeMounts against the chart's own volumes and mounts, and each other: the
names and paths the API server would refuse as duplicates, a mount of no volume, a mount inside the
read-only topology folder, and storage.mountPath over a fixed mount of the chart. Paths are compared
cleaned (`/data/`, `//tmp` and `/tmp/../data` are /data, /tmp and /data).
*/}}
{{- define "maskrcnn-dist.validateVolumes" -}}
{{- $chartVolumes := list "topology" "dshm" "tmp" "home" "data" -}}
{{- $fixed := list (include "maskrcnn-dist.topologyDir" .) "/dev/shm" "/tmp" "/home/maskrcnn" -}}
{{- $dataPath := clean .Values.storage.mountPath -}}
{{- if has $dataPath $fixed -}}
{{- fail (printf "storage.mountPath=%s clashes with a mount of the chart (%s): choose another path" .Values.storage.mountPath (join ", " $fixed)) -}}
{{- end -}}
{{- $names := list -}}
{{- range $i, $vol := .Values.extraVolumes -}}
{{- if has $vol.name $chartVolumes -}}
{{- fail (printf "extraVolumes[%d].name=%s clashes with a volume of the chart (%s): rename it" $i $vol.name (join ", " $chartVolumes)) -}}
{{- end -}}
{{- if has $vol.name $names -}}
{{- fail (printf "extraVolumes[%d].name=%s: another extra volume has this name; volume names must be unique" $i $vol.name) -}}
{{- end -}}
{{- $names = append $names $vol.name -}}
{{- end -}}
{{- $paths := append $fixed $dataPath -}}
{{- $seen := list -}}
{{- range $i, $mount := .Values.extraVolumeMounts -}}
{{- $path := clean $mount.mountPath -}}
{{- if has $path $paths -}}
{{- fail (printf "extraVolumeMounts[%d].mountPath=%s clashes with a mount of the chart (%s): choose another path" $i $mount.mountPath (join ", " $paths)) -}}
{{- end -}}
{{- if hasPrefix (printf "%s/" (include "maskrcnn-dist.topologyDir" $)) $path -}}
{{- fail (printf "extraVolumeMounts[%d].mountPath=%s lies inside the read-only topology folder %s: choose another path" $i $mount.mountPath (include "maskrcnn-dist.topologyDir" $)) -}}
{{- end -}}
{{- if has $path $seen -}}
{{- fail (printf "extraVolumeMounts[%d].mountPath=%s: another extra mount has this path" $i $mount.mountPath) -}}
{{- end -}}
{{- $seen = append $seen $path -}}
{{- if not (has $mount.name $names) -}}
{{- fail (printf "extraVolumeMounts[%d].name=%s names no volume of extraVolumes (%s): add the volume to extraVolumes" $i $mount.name (join ", " (default (list "none") $names))) -}}
{{- end -}}
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
{{- if and $withEstimate .Values.estimate -}}
{{- $_ := set $topology "estimate" .Values.estimate -}}
{{- end -}}
{{- toYaml $topology -}}
{{- end -}}
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

{{/*
The training pod, for every workload: the StatefulSets' template and the JobSet's Jobs' template are
this one definition. Argument: (dict "root" $ "role" "master"|"worker" "workload" "statefulset"|"jobset").
*/}}
{{- define "maskrcnn-dist.podTemplate" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $jobset := eq .workload "jobset" -}}
{{- $v := index $root.Values $role -}}
{{- $gpus := int $v.gpus -}}
{{- $gpuResource := $root.Values.gpuResourceName -}}
{{- $dataMount := ternary "readWrite" (include "maskrcnn-dist.workerMounts" $root) (eq $role "master") -}}
{{- $resources := deepCopy (default (dict) $v.resources) -}}
{{- if gt $gpus 0 -}}
{{- /* Same value as this role's `devices` in the topology ConfigMap: one source, never out of step. */ -}}
{{- $_ := set $resources "limits" (merge (dict $gpuResource $gpus) (default (dict) (get $resources "limits"))) -}}
{{- end -}}
{{- $tolerations := default (list) $v.tolerations -}}
{{- $gpuToleration := dict "key" $gpuResource "operator" "Exists" "effect" "NoSchedule" -}}
{{- if and (gt $gpus 0) $root.Values.gpuToleration (not (has $gpuToleration $tolerations)) -}}
{{- $tolerations = append $tolerations $gpuToleration -}}
{{- end -}}
metadata:
  labels:
    {{- include "maskrcnn-dist.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $role }}
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
  {{- if $jobset }}
  # A Job's pod never restarts in place: a failed pod fails its Job (backoffLimit 0), and the JobSet's
  # failure policy decides what happens to the whole group.
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
  terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml $root.Values.podSecurityContext | nindent 4 }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "maskrcnn-dist.affinity" (dict "root" $root "affinity" $v.affinity)) }}
  affinity:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: trainer
      image: {{ include "maskrcnn-dist.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      # The image's entrypoint (dumb-init -> maskrcnn-launch) gets these arguments; the launcher
      # turns the topology and the pod identity below into rank, world size and MASTER_ADDR/PORT,
      # waits for the master, then execs the trainer with everything after `--`.
      args:
        - launch
        - --topology
        - $(MASKRCNN_TOPOLOGY)
        - --
        {{- range $root.Values.trainer.args }}
        - {{ tpl (toString .) $root | quote }}
        {{- end }}
      # Exactly the variables maskrcnn_launcher.contract.POD_ENV_VARS names (a chart test checks
      # it), then the user's extraEnv.
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
        - name: MASKRCNN_HEADLESS_SERVICE
          value: {{ include "maskrcnn-dist.headlessService" $root | quote }}
        - name: MASKRCNN_CLUSTER_DOMAIN
          value: {{ $root.Values.network.clusterDomain | quote }}
        {{- if $jobset }}
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
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if eq $role "master" }}
      ports:
        - name: rendezvous
          containerPort: {{ $root.Values.network.masterPort }}
          protocol: TCP
      {{- end }}
      {{- with $resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.containerSecurityContext | nindent 8 }}
      volumeMounts:
        - name: topology
          mountPath: {{ include "maskrcnn-dist.topologyDir" $root }}
          readOnly: true
        # DataLoader workers pass batches through shared memory; the runtime's 64 MiB /dev/shm
        # makes them die with "Bus error".
        - name: dshm
          mountPath: /dev/shm
        # The root filesystem is read-only: /tmp and HOME (caches: matplotlib, torch) are the
        # only writable places besides the data volume.
        - name: tmp
          mountPath: /tmp
        - name: home
          mountPath: /home/maskrcnn
        {{- if ne $dataMount "none" }}
        - name: data
          mountPath: {{ $root.Values.storage.mountPath }}
          readOnly: {{ eq $dataMount "readOnly" }}
        {{- end }}
        {{- with $root.Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: topology
      configMap:
        name: {{ include "maskrcnn-dist.topologyConfigMap" $root }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $root.Values.shmSize }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ $root.Values.scratchSize }}
    - name: home
      emptyDir:
        sizeLimit: {{ $root.Values.scratchSize }}
    {{- if ne $dataMount "none" }}
    - name: data
      persistentVolumeClaim:
        claimName: {{ include "maskrcnn-dist.claimName" $root }}
        readOnly: {{ eq $dataMount "readOnly" }}
    {{- end }}
    {{- with $root.Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
