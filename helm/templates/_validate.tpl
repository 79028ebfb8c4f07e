{{/*
Validation: the cross-field checks values.schema.json cannot express, run on every render (each
`fail` message names the values to change): what the API server, the JobSet webhook or the launcher
would refuse later is refused by `helm template`.
*/}}

{{/*
Every check, included once from statefulsets.yaml (a file rendered for every workload, whether it
renders StatefulSets or not).
*/}}
{{- define "maskrcnn-dist.validate" -}}
{{- include "maskrcnn-dist.validateNames" . -}}
{{- include "maskrcnn-dist.validateMetadata" . -}}
{{- include "maskrcnn-dist.validateTopology" . -}}
{{- if and .Values.inspect.enabled .Values.kubeflowTrainer.runtime.enabled -}}
{{- fail "inspect.enabled and kubeflowTrainer.runtime.enabled: an inspect release is only the volume and a pod on it; install it as a release of its own, with storage.existingClaim naming the claim" -}}
{{- end -}}
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
{{- include "maskrcnn-dist.validateEstimate" . -}}
{{- include "maskrcnn-dist.validateKubeflow" . -}}
{{- end -}}

{{/*
The variables of the launcher's environment contract a user must not set through extraEnv (besides
every MASKRCNN_* but MASKRCNN_WAIT_TIMEOUT and MASKRCNN_TRAINER_CMD): the pod's identity, set by the
chart, the kubelet or Kubeflow Trainer (PET_*: the launcher would take the pod for a TrainJob's node),
and what the launcher exports. A chart test compares it with
maskrcnn_launcher.contract.
*/}}
{{- define "maskrcnn-dist.contractEnv" -}}
{{- toYaml (list "POD_NAME" "HOSTNAME" "POD_NAMESPACE" "POD_IP" "MASTER_ADDR" "MASTER_PORT" "RANK" "WORLD_SIZE" "LOCAL_RANK" "LOCAL_WORLD_SIZE" "TP_SOCKET_IFNAME" "GLOO_SOCKET_IFNAME" "NCCL_SOCKET_IFNAME" "PET_NNODES" "PET_NPROC_PER_NODE" "PET_NODE_RANK" "PET_MASTER_ADDR" "PET_MASTER_PORT") -}}
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

{{/*
The topology's estimate against trainer.args: batch_size and micro_batches come from the trainer's
--batch-size and --micro-batches (_topology.tpl's maskrcnn-dist.estimate), so an estimate that gives
them otherwise describes another run than the one the pods train, and is refused; a flag value that
is not a count cannot be taken. And the launcher's own rule: no more micro-batches than images.
*/}}
{{- define "maskrcnn-dist.validateEstimate" -}}
{{- $given := default (dict) .Values.estimate -}}
{{- $from := dict -}}
{{- range $key, $flag := include "maskrcnn-dist.estimateFlags" . | fromYaml -}}
{{- $value := include "maskrcnn-dist.trainerFlag" (dict "root" $ "flag" $flag) -}}
{{- $_ := set $from $key (printf "estimate.%s" $key) -}}
{{- if $value -}}
{{- if not (and (regexMatch "^[0-9]+$" $value) (gt (atoi $value) 0)) -}}
{{- fail (printf "trainer.args: %s %s is not a positive whole number (the trainer would refuse it, and estimate.%s cannot be taken from it)" $flag $value $key) -}}
{{- end -}}
{{- if and (hasKey $given $key) (ne (int (get $given $key)) (atoi $value)) -}}
{{- fail (printf "estimate.%s (%v) contradicts trainer.args %s %s: estimate describes the run the trainer's flags decide; leave estimate.%s out (the chart takes it from trainer.args) or give the same value" $key (get $given $key) $flag $value $key) -}}
{{- end -}}
{{- if not (hasKey $given $key) -}}
{{- $_ := set $from $key (printf "trainer.args %s" $flag) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $estimate := include "maskrcnn-dist.estimate" . | fromYaml -}}
{{- $batch := int (default 2 $estimate.batch_size) -}}
{{- if and (hasKey $estimate "micro_batches") (gt (int $estimate.micro_batches) $batch) -}}
{{- fail (printf "%s (%v) exceeds %s (%d): the launcher would refuse the topology and no pod would start, although estimate only feeds the printed plan; the run's micro-batches are the trainer's --micro-batches" $from.micro_batches $estimate.micro_batches $from.batch_size $batch) -}}
{{- end -}}
{{- end -}}

{{/*
The Kubeflow training runtime and its TrainJob (kubeflowTrainer): what the launcher would refuse in a
TrainJob's pods (maskrcnn_launcher.trainjob: a pipeline topology, nodes with other devices, another
port than Trainer's), and the names the JobSet webhook checks: the TrainJob is the JobSet's name and
subdomain, its longest pod name `<name>-node-0-<numNodes - 1>-<5 characters>` a DNS-1035 label.
*/}}
{{- define "maskrcnn-dist.validateKubeflow" -}}
{{- $kf := .Values.kubeflowTrainer -}}
{{- if and $kf.trainJob.enabled (not $kf.runtime.enabled) -}}
{{- fail "kubeflowTrainer.trainJob.enabled needs kubeflowTrainer.runtime.enabled: the TrainJob trains with the release's runtime" -}}
{{- end -}}
{{- if $kf.runtime.enabled -}}
{{- if ne .Values.engine "ddp" -}}
{{- fail (printf "kubeflowTrainer.runtime.enabled needs engine=ddp (engine is %s): Kubeflow Trainer's torch runtime starts every node under torchrun with the same resourcesPerNode, while the pipeline wants a CPU master and GPU stage workers, one process each; run the pipeline with the chart's StatefulSets or JobSet" .Values.engine) -}}
{{- end -}}
{{- if ne (int .Values.master.gpus) (int .Values.worker.gpus) -}}
{{- fail (printf "kubeflowTrainer.runtime.enabled: master.gpus (%v) and worker.gpus (%v) differ, but a TrainJob gives every node the same resources (the runtime's pod takes the worker's): give both the same value" .Values.master.gpus .Values.worker.gpus) -}}
{{- end -}}
{{- if ne (int .Values.network.masterPort) 29500 -}}
{{- fail (printf "kubeflowTrainer.runtime.enabled: network.masterPort is %v, but Kubeflow Trainer fixes the rendezvous port at 29500 (PET_MASTER_PORT, the node container's port): set network.masterPort=29500" .Values.network.masterPort) -}}
{{- end -}}
{{- end -}}
{{- if $kf.trainJob.enabled -}}
{{- $name := include "maskrcnn-dist.trainJobName" . -}}
{{- $pod := printf "%s-node-0-%d-abcde" $name (int (include "maskrcnn-dist.workerCount" .)) -}}
{{- if or (not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name)) (gt (len $pod) 63) -}}
{{- fail (printf "the TrainJob's name %q (kubeflowTrainer.trainJob.name, else the fullname) must be a DNS-1035 label short enough for its pods' names (%s: at most 63 characters)" $name $pod) -}}
{{- end -}}
{{- end -}}
{{- end -}}
