{{/*
The training pod's volumes and the container's mounts: the topology ConfigMap, shared memory and the
writable scratch folders (the root filesystem is read-only), the data volume as the role mounts it,
and the user's extraVolumes and extraVolumeMounts (_validate_pod.tpl checks them against these).
*/}}

{{/* Where the topology ConfigMap is mounted. */}}
{{- define "maskrcnn-dist.topologyDir" -}}/etc/maskrcnn{{- end -}}

{{/* The topology file the launcher reads (MASKRCNN_TOPOLOGY), in the mounted folder. */}}
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
How one pod mounts the data volume: none | readOnly | readWrite. The master and a TrainJob's nodes
(node 0 writes the run) read and write it; a worker as workerMounts says. Argument: the pod template's.
*/}}
{{- define "maskrcnn-dist.dataMount" -}}
{{- ternary "readWrite" (include "maskrcnn-dist.workerMounts" .root) (or (eq .role "master") (eq .workload "trainjob")) -}}
{{- end -}}

{{/* The container's `volumeMounts`, to be indented under it. Argument: the pod template's. */}}
{{- define "maskrcnn-dist.trainerVolumeMounts" -}}
{{- $dataMount := include "maskrcnn-dist.dataMount" . -}}
volumeMounts:
  - name: topology
    mountPath: {{ include "maskrcnn-dist.topologyDir" .root }}
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
    mountPath: {{ .root.Values.storage.mountPath }}
    readOnly: {{ eq $dataMount "readOnly" }}
  {{- end }}
  {{- with .root.Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The pod's `volumes`, to be indented under its spec. Argument: the pod template's. */}}
{{- define "maskrcnn-dist.podVolumes" -}}
{{- $root := .root -}}
{{- $dataMount := include "maskrcnn-dist.dataMount" . -}}
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
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}
