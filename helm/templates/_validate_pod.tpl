{{/*
Validation of what the user adds to the training pods: labels and annotations, resources, environment
variables and volumes, against what the chart, the controllers and the launcher's environment contract
own. Included from maskrcnn-dist.validate (_validate.tpl).
*/}}

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
GPUs come from a role's `gpus` alone: a GPU (or other accelerator) resource set by hand in its
requests or limits would disagree with the topology's device count.
*/}}
{{- define "maskrcnn-dist.validateResources" -}}
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
{{- end -}}

{{/*
extraEnv: one of value and valueFrom per variable, and none of the launcher's environment contract
(maskrcnn-dist.contractEnv, and every MASKRCNN_* but maskrcnn-dist.userEnv).
*/}}
{{- define "maskrcnn-dist.validateEnv" -}}
{{- range $i, $env := .Values.extraEnv -}}
{{- if and (hasKey $env "value") (hasKey $env "valueFrom") -}}
{{- fail (printf "extraEnv[%d] (%s) has both value and valueFrom: give one of them" $i $env.name) -}}
{{- end -}}
{{- if or (has $env.name (include "maskrcnn-dist.contractEnv" $ | fromYamlArray)) (and (hasPrefix "MASKRCNN_" $env.name) (not (has $env.name (include "maskrcnn-dist.userEnv" $ | fromYamlArray)))) -}}
{{- fail (printf "extraEnv[%d].name=%s: %s belongs to the launcher's environment contract (maskrcnn_launcher.contract): the chart sets the pod's identity and the launcher exports the rank and the master's address; remove it from extraEnv (for the socket interface set network.interface)" $i $env.name $env.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The variables of the launcher's environment contract a user must not set through extraEnv (besides
every MASKRCNN_* but the user's, below): the pod's identity, set by the
chart, the kubelet or Kubeflow Trainer (PET_*: the launcher would take the pod for a TrainJob's node),
and what the launcher exports. A chart test compares it with maskrcnn_launcher.contract.
*/}}
{{- define "maskrcnn-dist.contractEnv" -}}
{{- toYaml (list "POD_NAME" "HOSTNAME" "POD_NAMESPACE" "POD_IP" "MASTER_ADDR" "MASTER_PORT" "RANK" "WORLD_SIZE" "LOCAL_RANK" "LOCAL_WORLD_SIZE" "TP_SOCKET_IFNAME" "GLOO_SOCKET_IFNAME" "NCCL_SOCKET_IFNAME" "PET_NNODES" "PET_NPROC_PER_NODE" "PET_NODE_RANK" "PET_MASTER_ADDR" "PET_MASTER_PORT") -}}
{{- end -}}

{{/*
The MASKRCNN_* variables a user may set through extraEnv (maskrcnn_launcher.contract.USER_ENV_VARS; a
chart test compares the two): the launcher's wait for the master, its trainer command, the
tracebacks of every entry point (MASKRCNN_DEBUG) and the pipeline's device-map guard
(MASKRCNN_DEVICE_MAP_GUARD). Every other MASKRCNN_* is the pod's identity.
*/}}
{{- define "maskrcnn-dist.userEnv" -}}
{{- toYaml (list "MASKRCNN_WAIT_TIMEOUT" "MASKRCNN_TRAINER_CMD" "MASKRCNN_DEBUG" "MASKRCNN_DEVICE_MAP_GUARD") -}}
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
