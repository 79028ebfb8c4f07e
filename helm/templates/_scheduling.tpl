{{/*
Where the training pods may run and what they ask for: spreadAcrossNodes' anti-affinity, the GPU
toleration, and a role's resources with the GPU limit.
*/}}

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
A role's tolerations: its own, plus the GPU taint's (gpuResourceName, NoSchedule) when it has GPUs
and gpuToleration is on, unless it already tolerates exactly that. YAML, empty when there are none.
Argument: (dict "root" $ "role" "master"|"worker").
*/}}
{{- define "maskrcnn-dist.tolerations" -}}
{{- $v := index .root.Values .role -}}
{{- $tolerations := default (list) $v.tolerations -}}
{{- $gpuToleration := dict "key" .root.Values.gpuResourceName "operator" "Exists" "effect" "NoSchedule" -}}
{{- if and (gt (int $v.gpus) 0) .root.Values.gpuToleration (not (has $gpuToleration $tolerations)) -}}
{{- $tolerations = append $tolerations $gpuToleration -}}
{{- end -}}
{{- with $tolerations -}}
{{- toYaml . -}}
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
