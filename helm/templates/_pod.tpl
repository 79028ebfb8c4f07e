{{/*
The training pod, one definition for every workload (StatefulSets, the JobSet, a Kubeflow TrainJob's
nodes): the image, the topology mount, the workers' data mount, the anti-affinity of
spreadAcrossNodes, the resources with the GPU limit, the trainer's arguments, and the pod template.
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

{{/* Where the topology ConfigMap is mounted, and the file the launcher reads. */}}
{{- define "maskrcnn-dist.topologyDir" -}}/etc/maskrcnn{{- end -}}

{{- define "maskrcnn-dist.topologyPath" -}}{{ include "maskrcnn-dist.topologyDir" . }}/topology.yaml{{- end -}}

{{/* How workers mount the volume: none | readOnly | readWrite (resolves `auto`). */}}
{{- define "maskrcnn-dist.workerMounts" -}}
{{- if eq .Values.storage.workerMount "auto" -}}
{{- if eq .Values.engine "ddp" -}}readOnly{{- else -}}none{{- end -}}
{{- else -}}
{{- .Values.storage.workerMount -}}
{{- end -}}
{{- end -}}

{{/*
Anti-affinity that keeps every training pod of the release on its own node (spreadAcrossNodes),
matched on the component label so the helm test pod neither blocks nor is blocked by it; merged
into the role's own affinity. Argument: (dict "root" $ "affinity" <role affinity> "components"
<the training pods' components: master and worker, or a TrainJob's node>).
*/}}
{{- define "maskrcnn-dist.affinity" -}}
{{- $affinity := deepCopy (default (dict) .affinity) -}}
{{- if .root.Values.spreadAcrossNodes -}}
{{- $anti := default (dict) (get $affinity "podAntiAffinity") -}}
{{- $required := default (list) (get $anti "requiredDuringSchedulingIgnoredDuringExecution") -}}
{{- $roles := dict "key" "app.kubernetes.io/component" "operator" "In" "values" .components -}}
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
A role's resources: its requests and limits, with the GPU limit from its `gpus` (the same value as
its `devices` in the topology ConfigMap: one source, never out of step). YAML, empty when there are
none. Argument: (dict "root" $ "role" "master"|"worker").
*/}}
{{- define "maskrcnn-dist.resources" -}}
{{- $v := index .root.Values .role -}}
{{- $resources := deepCopy (default (dict) $v.resources) -}}
{{- if gt (int $v.gpus) 0 -}}
{{- $_ := set $resources "limits" (merge (dict .root.Values.gpuResourceName (int $v.gpus)) (default (dict) (get $resources "limits"))) -}}
{{- end -}}
{{- with $resources -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/* The trainer's arguments (trainer.args, each rendered with tpl), as YAML list items. */}}
{{- define "maskrcnn-dist.trainerArgs" -}}
{{- range $i, $arg := .Values.trainer.args }}
{{- if $i }}{{ "\n" }}{{ end }}- {{ tpl (toString $arg) $ | quote }}
{{- end -}}
{{- end -}}

{{/*
The training pod, for every workload: the StatefulSets' template, the JobSet's Jobs' template and the
Kubeflow training runtime's node template are this one definition. Argument: (dict "root" $ "role"
"master"|"worker" "workload" "statefulset"|"jobset"|"trainjob"). A TrainJob's nodes are all alike:
they take the worker's values, mount the volume read-write (node 0 writes the run) and are labelled
component `node`; Kubeflow Trainer fills the container named `node` (PET_* variables, the TrainJob's
image, args and resourcesPerNode).
*/}}
{{- define "maskrcnn-dist.podTemplate" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $jobset := eq .workload "jobset" -}}
{{- $trainjob := eq .workload "trainjob" -}}
{{- $container := include "maskrcnn-dist.trainerContainer" .workload -}}
{{- $v := index $root.Values $role -}}
{{- $gpus := int $v.gpus -}}
{{- $gpuResource := $root.Values.gpuResourceName -}}
{{- $dataMount := ternary "readWrite" (include "maskrcnn-dist.workerMounts" $root) (or (eq $role "master") $trainjob) -}}
{{- $tolerations := default (list) $v.tolerations -}}
{{- $gpuToleration := dict "key" $gpuResource "operator" "Exists" "effect" "NoSchedule" -}}
{{- if and (gt $gpus 0) $root.Values.gpuToleration (not (has $gpuToleration $tolerations)) -}}
{{- $tolerations = append $tolerations $gpuToleration -}}
{{- end -}}
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
  # SIGTERM, then SIGKILL this many seconds later; the trainer reads the same value
  # (MASKRCNN_TERMINATION_GRACE_SECONDS below) to check that a step and a checkpoint write fit.
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
  {{- $components := ternary (list "node") (list "master" "worker") $trainjob }}
  {{- with (include "maskrcnn-dist.affinity" (dict "root" $root "affinity" $v.affinity "components" $components)) }}
  affinity:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ $container }}
      image: {{ include "maskrcnn-dist.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      {{- if $trainjob }}
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
      {{- else }}
      # The image's entrypoint (dumb-init -> maskrcnn-launch) gets these arguments; the launcher
      # turns the topology and the pod identity below into rank, world size and MASTER_ADDR/PORT,
      # waits for the master, then execs the trainer with everything after `--`.
      args:
        - launch
        - --topology
        - $(MASKRCNN_TOPOLOGY)
        - --
      {{- end }}
        {{- with (include "maskrcnn-dist.trainerArgs" $root) }}
        {{- . | nindent 8 }}
        {{- end }}
      {{- if $trainjob }}
      # Exactly the variables maskrcnn_launcher.contract.TRAINJOB_POD_ENV_VARS and TRAINER_READ_VARS name
      # (the node comes from Trainer's PET_*; a chart test checks it), then the user's extraEnv.
      {{- else }}
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
        {{- if not $trainjob }}
        - name: MASKRCNN_HEADLESS_SERVICE
          value: {{ include "maskrcnn-dist.headlessService" $root | quote }}
        - name: MASKRCNN_CLUSTER_DOMAIN
          value: {{ $root.Values.network.clusterDomain | quote }}
        {{- end }}
        # The pod's terminationGracePeriodSeconds, one value: the trainer's budget for stopping at a
        # step boundary with a checkpoint after SIGTERM (contract.TERMINATION_GRACE_SECONDS).
        - name: MASKRCNN_TERMINATION_GRACE_SECONDS
          value: {{ $root.Values.terminationGracePeriodSeconds | quote }}
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
      {{- with (include "maskrcnn-dist.resources" (dict "root" $root "role" $role)) }}
      resources:
        {{- . | nindent 8 }}
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
