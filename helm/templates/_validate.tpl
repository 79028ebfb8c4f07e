{{/*
Validation: the cross-field checks values.schema.json cannot express, run on every render (each
`fail` message names the values to change): what the API server, the JobSet webhook or the launcher
would refuse later is refused by `helm template`. The checks live by concern: object names and the
network here, the topology and the engine in _validate_topology.tpl, what the user adds to the
training pod (labels, resources, environment, volumes) in _validate_pod.tpl, the inspect release and
the Kubeflow training runtime in _validate_workloads.tpl.
*/}}

{{/*
Every check, included once from statefulsets.yaml (a file rendered for every workload, whether it
renders StatefulSets or not). The first check that fails is the one reported.
*/}}
{{- define "maskrcnn-dist.validate" -}}
{{- include "maskrcnn-dist.validateNames" . -}}
{{- include "maskrcnn-dist.validateMetadata" . -}}
{{- include "maskrcnn-dist.validateTopology" . -}}
{{- include "maskrcnn-dist.validateInspect" . -}}
{{- include "maskrcnn-dist.validateNetwork" . -}}
{{- include "maskrcnn-dist.validateEngine" . -}}
{{- include "maskrcnn-dist.validateResources" . -}}
{{- include "maskrcnn-dist.validateEnv" . -}}
{{- include "maskrcnn-dist.validateVolumes" . -}}
{{- include "maskrcnn-dist.validateEstimate" . -}}
{{- include "maskrcnn-dist.validateKubeflow" . -}}
{{- include "maskrcnn-dist.validateElastic" . -}}
{{- include "maskrcnn-dist.validateData" . -}}
{{- include "maskrcnn-dist.validateTrainerArgs" . -}}
{{- end -}}

{{/*
trainer.args as the trainer reads them: it refuses an option given twice (`--lr 0.01 ... --lr=0.02`, or
`--amp` and `--no-amp`), which would fail every pod at start-up; and jobset.elastic passes --elastic itself.
*/}}
{{- define "maskrcnn-dist.validateTrainerArgs" -}}
{{- $seen := dict -}}
{{- range .Values.trainer.args -}}
{{- $arg := toString . -}}
{{- $name := regexReplaceAll "=.*$" $arg "" | trimPrefix "--" | trimPrefix "no-" -}}
{{- if and (hasPrefix "--" $arg) $name -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "trainer.args gives --%s more than once (%s, then %s): the trainer refuses an option given twice; give it once" $name (get $seen $name) $arg) -}}
{{- end -}}
{{- $_ := set $seen $name $arg -}}
{{- if and $.Values.jobset.elastic.enabled (eq $name "elastic") -}}
{{- fail (printf "trainer.args: %s beside jobset.elastic.enabled, which passes --elastic to every trainer itself: leave it out of trainer.args" $arg) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The data: trainer.data's flags and the same flags in trainer.args would both reach the trainer, and
which one wins would be a guess (or, --data-path beside a split flag, the trainer's refusal in a pod).
*/}}
{{- define "maskrcnn-dist.validateData" -}}
{{- $flags := values (include "maskrcnn-dist.dataFlags" . | fromYaml) -}}
{{- $given := include "maskrcnn-dist.dataArgs" . | fromYamlArray -}}
{{- if $given -}}
{{- range .Values.trainer.args -}}
{{- $arg := toString . -}}
{{- if has (regexReplaceAll "=.*$" $arg "") $flags -}}
{{- fail (printf "trainer.data and trainer.args both name the data (%s in trainer.args): give it in one place: move %s into trainer.data, or trainer.data's keys into trainer.args" $arg (regexReplaceAll "=.*$" $arg "")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $cache := (.Values.trainer.data | default dict).cache -}}
{{- if kindIs "bool" $cache -}}
{{- fail (printf "trainer.data.cache: YAML read a bare word as the boolean %v (off, on, no and yes are booleans there): quote it, e.g. cache: \"off\"" $cache) -}}
{{- end -}}
{{- if and (kindIs "string" $cache) (has (lower (trim $cache)) (list "auto" "off")) (ne $cache (lower (trim $cache))) -}}
{{- fail (printf "trainer.data.cache: %q: write %s in lower case (./%s names a folder of that name)" $cache (lower (trim $cache)) (trim $cache)) -}}
{{- end -}}
{{- if include "maskrcnn-dist.cacheArgs" . | fromYamlArray -}}
{{- range .Values.trainer.args -}}
{{- if eq (regexReplaceAll "=.*$" (toString .) "") "--data-cache" -}}
{{- fail "trainer.data.cache and --data-cache in trainer.args: give the cache folder in one place" -}}
{{- end -}}
{{- end -}}
{{- end -}}
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

{{/* The NetworkPolicy's range of peer ports (the pipeline's RPC ports) must not be empty. */}}
{{- define "maskrcnn-dist.validateNetwork" -}}
{{- if gt (int .Values.networkPolicy.peerPorts.from) (int .Values.networkPolicy.peerPorts.to) -}}
{{- fail (printf "networkPolicy.peerPorts: from (%v) must not exceed to (%v)" .Values.networkPolicy.peerPorts.from .Values.networkPolicy.peerPorts.to) -}}
{{- end -}}
{{- end -}}
