{{/*
Validation of the workloads beside the training StatefulSets and JobSet: the inspect release (a pod on
the run's volume) and the Kubeflow training runtime with its TrainJob. Included from
maskrcnn-dist.validate (_validate.tpl).
*/}}

{{/* An inspect release is the volume and a pod on it, never a Kubeflow training runtime too. */}}
{{- define "maskrcnn-dist.validateInspect" -}}
{{- if and .Values.inspect.enabled .Values.kubeflowTrainer.runtime.enabled -}}
{{- fail "inspect.enabled and kubeflowTrainer.runtime.enabled: an inspect release is only the volume and a pod on it; install it as a release of its own, with storage.existingClaim naming the claim" -}}
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


{{/*
jobset.elastic: only ddp replicas can go on without a worker (a pipeline stage holds a part of the
model that no other pod has), and the Kubeflow runtime's JobSet is Trainer's, not the release's.
*/}}
{{- define "maskrcnn-dist.validateElastic" -}}
{{- if .Values.jobset.elastic.enabled -}}
{{- if ne .Values.engine "ddp" -}}
{{- fail (printf "jobset.elastic.enabled needs engine=ddp (engine is %s): a pipeline stage holds a part of the model no other pod has, so a lost stage worker restarts the group" .Values.engine) -}}
{{- end -}}
{{- if .Values.kubeflowTrainer.runtime.enabled -}}
{{- fail "jobset.elastic.enabled and kubeflowTrainer.runtime.enabled: the TrainJob's JobSet is Kubeflow Trainer's to shape; jobset.elastic applies to the release's own JobSet" -}}
{{- end -}}
{{- end -}}
{{- end -}}
