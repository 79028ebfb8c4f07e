{{/*
Validation of the run's shape: the pipeline's stages against the launcher's topology rules, the engine
against the GPUs and the data mounts, and the topology's estimate against trainer.args. Included from
maskrcnn-dist.validate (_validate.tpl).
*/}}

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
{{- end -}}
{{- end -}}

{{/*
The engine against the GPUs and the data volume: the pipeline master holds no model stage, a ddp
process group has one backend for every pod, every ddp pod reads the dataset, and TensorPipe device
maps move CUDA tensors.
*/}}
{{- define "maskrcnn-dist.validateEngine" -}}
{{- if and (eq .Values.engine "pipeline") (gt (int .Values.master.gpus) 0) -}}
{{- fail "master.gpus must be 0 with engine=pipeline: the pipeline master holds the data loader and the optimizer, not a model stage; give the GPUs to worker.gpus" -}}
{{- end -}}
{{- if and (eq .Values.engine "ddp") (ne (gt (int .Values.master.gpus) 0) (gt (int .Values.worker.gpus) 0)) -}}
{{- fail "engine=ddp needs master.gpus and worker.gpus both > 0 or both 0: one process-group backend (nccl or gloo) for every pod" -}}
{{- end -}}
{{- if and (eq .Values.engine "ddp") (eq .Values.storage.workerMount "none") -}}
{{- fail "storage.workerMount=none with engine=ddp: every ddp pod reads the dataset; use auto or readOnly" -}}
{{- end -}}
{{- if and (eq .Values.engine "pipeline") (eq .Values.pipeline.transport "device_maps") (eq (int .Values.worker.gpus) 0) -}}
{{- fail "pipeline.transport=device_maps needs GPUs: worker.gpus is 0, and TensorPipe device maps move CUDA tensors between GPUs; use pipeline.transport=cpu on CPU" -}}
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
