"""Rendered workload objects -> `PodSpec`s, the pods as the kubelet would start them.

Nothing here is hand-written per pod: names, environment, command, arguments, mounts, security
context and resources all come from the StatefulSets or the Jobs' pod templates (and the ConfigMaps)
the API server would receive. What the API server and the kubelet would add is added the way they do:

* one pod per StatefulSet ordinal, named `<statefulset>-<ordinal>`, hostname = pod name,
  DNS `<pod>.<serviceName>.<namespace>.svc.<cluster domain>` (JobSet pods: jobset.py);
* downward-API environment (`fieldRef`: metadata.name, metadata.namespace, status.podIP, ...)
  becomes literal values;
* `$(VAR)` references in env values, command and args are expanded like the kubelet's
  third_party/forked/golang/expansion: defined variables are replaced, `$$` is a literal `$`,
  unknown references stay as written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Where a pod's cluster domain comes from: the chart passes it to the launcher in this variable, and
# the emulated DNS serves that domain (a real cluster serves its kubelet's --cluster-domain).
CLUSTER_DOMAIN_ENV = "MASKRCNN_CLUSTER_DOMAIN"
# Extended resources that are GPUs (nvidia.com/gpu, a MIG profile, amd.com/gpu, gpu.intel.com/...).
GPU_VENDORS = ("nvidia.com", "amd.com", "gpu.intel.com")


class SpecError(Exception):
    """The rendered chart uses something this harness cannot run in docker (named in the message)."""


# -- kubelet expansion -------------------------------------------------------------------------


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes `$(VAR)` expansion (the kubelet's algorithm, character for character)."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1 :]
            if rest[0] == "$":  # `$$` -> `$`
                out.append("$")
                advance = 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:  # unterminated: kept as written
                    out.append("$(")
                    advance = 1
                else:
                    name = rest[1:close]
                    value = lookup(name)
                    out.append(value if value is not None else f"$({name})")
                    advance = close + 1
            else:
                out.append("$" + rest[0])
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


# -- pods --------------------------------------------------------------------------------------


@dataclass
class Mount:
    """One volumeMount with its volume resolved: kind is configMap, emptyDir or pvc."""

    path: str
    kind: str
    read_only: bool = False
    files: dict[str, str] = field(default_factory=dict)  # configMap: file name -> content
    medium: str = ""  # emptyDir
    size_limit: str | None = None  # emptyDir
    claim: str = ""  # pvc


@dataclass
class PodSpec:
    """One pod's single container, ready to become a `docker run`."""

    name: str  # StatefulSet: <statefulset>-<ordinal>; JobSet: <job>-<completion index>-<suffix>
    owner: str  # the StatefulSet, or the Job
    ordinal: int  # the StatefulSet ordinal, or the Job's completion index
    component: str  # the app.kubernetes.io/component label: master or worker
    namespace: str
    service: str  # the StatefulSet's serviceName, or the JobSet's subdomain (the headless Service)
    cluster_domain: str
    image: str
    command: list[str] | None
    args: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    pod_ip: str
    run_as_user: int | None = None
    run_as_group: int | None = None
    fs_group: int | None = None
    read_only_root: bool = False
    no_new_privileges: bool = False
    cap_drop: list[str] = field(default_factory=list)
    memory_limit: str | None = None
    cpu_request: str | None = None
    gpus: int = 0
    grace_seconds: int = 30
    hostname: str = ""  # spec.hostname (a JobSet pod's); empty: the pod name, as in a StatefulSet
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        """The container's host name and the first label of its DNS name."""
        return self.hostname or self.name

    @property
    def fqdn(self) -> str:
        return f"{self.host}.{self.service}.{self.namespace}.svc.{self.cluster_domain}"

    @property
    def dns_names(self) -> list[str]:
        """The names cluster DNS answers for this pod (with the pod's search path), and the Service's."""
        svc = f"{self.service}.{self.namespace}.svc.{self.cluster_domain}"
        return [
            f"{self.host}.{self.service}",
            f"{self.host}.{self.service}.{self.namespace}",
            f"{self.host}.{self.service}.{self.namespace}.svc",
            self.fqdn,
            self.service,
            f"{self.service}.{self.namespace}",
            svc,
        ]

    @property
    def dns_search(self) -> list[str]:
        d = self.cluster_domain
        return [f"{self.namespace}.svc.{d}", f"svc.{d}", d]


def _field_ref(path: str, pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": f"uid-{meta['name']}",
        "status.podIP": pod["podIP"],
        "status.podIPs": pod["podIP"],
        "status.hostIP": pod["hostIP"],
        "spec.nodeName": pod["nodeName"],
        "spec.serviceAccountName": pod.get("serviceAccountName", "default"),
    }
    if path in simple:
        return simple[path]
    sources = (("metadata.labels", meta.get("labels", {})), ("metadata.annotations", meta.get("annotations", {})))
    for prefix, source in sources:
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str(source.get(path[len(prefix) + 2 : -2], ""))
    raise SpecError(f"downward API fieldRef {path!r} is not supported by the e2e harness")


def container_env(
    container: dict[str, Any], pod: dict[str, Any], configmaps: Mapping[str, Mapping[str, str]]
) -> dict[str, str]:
    """The container's environment as the kubelet builds it (order kept; later refs see earlier vars)."""
    env: dict[str, str] = {}
    for item in container.get("envFrom", []) or []:
        ref = item.get("configMapRef")
        if ref is None:
            raise SpecError(f"envFrom {item} is not supported by the e2e harness")
        for key, value in configmaps[ref["name"]].items():
            env[item.get("prefix", "") + key] = value
    for item in container.get("env", []) or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env.get)
        elif "valueFrom" in item:
            source = item["valueFrom"]
            if "fieldRef" in source:
                env[name] = _field_ref(source["fieldRef"]["fieldPath"], pod)
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                env[name] = configmaps[ref["name"]][ref["key"]]
            else:
                raise SpecError(f"env {name}: valueFrom {sorted(source)} is not supported by the e2e harness")
        else:
            env[name] = ""
    return env


def configmaps_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {
        o["metadata"]["name"]: {k: str(v) for k, v in (o.get("data") or {}).items()}
        for o in objects
        if o.get("kind") == "ConfigMap"
    }


def pod_from_template(
    template: dict[str, Any],
    *,
    name: str,
    owner: str,
    ordinal: int,
    namespace: str,
    service: str,
    pod_ip: str,
    configmaps: Mapping[str, Mapping[str, str]],
    hostname: str = "",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    node_name: str = "e2e-node",
) -> PodSpec:
    """One pod of a pod template (a StatefulSet's or a Job's), as the kubelet would run it.
    `labels`/`annotations`: the pod's, when a controller adds to the template's (JobSet, Job);
    `extra_env`: variables a controller injects into the container (a Job's JOB_COMPLETION_INDEX)."""
    pod_spec = template["spec"]
    containers = pod_spec["containers"]
    if len(containers) != 1 or pod_spec.get("initContainers"):
        raise SpecError(f"{owner}: the harness runs exactly one container per pod")
    (container,) = containers
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    labels = dict(template["metadata"].get("labels", {}) if labels is None else labels)
    annotations = dict(template["metadata"].get("annotations", {}) if annotations is None else annotations)
    pod = {
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "podIP": pod_ip,
        "hostIP": pod_ip,
        "nodeName": node_name,
        "serviceAccountName": pod_spec.get("serviceAccountName", "default"),
    }
    env = container_env(container, pod, configmaps)
    for key, value in (extra_env or {}).items():
        env.setdefault(key, value)
    return PodSpec(
        name=name,
        owner=owner,
        ordinal=ordinal,
        component=labels.get("app.kubernetes.io/component", ""),
        namespace=namespace,
        service=service,
        cluster_domain=env.get(CLUSTER_DOMAIN_ENV, "cluster.local"),
        image=container["image"],
        command=[expand(str(c), env.get) for c in container["command"]] if "command" in container else None,
        args=[expand(str(a), env.get) for a in container.get("args", [])],
        env=env,
        mounts=[_mount(m, volumes, configmaps) for m in container.get("volumeMounts", [])],
        pod_ip=pod_ip,
        hostname=hostname,
        labels=labels,
        annotations=annotations,
        **_security_fields(pod_spec, container),
        **_resource_fields(pod_spec, container),
    )


def _security_fields(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The PodSpec fields of the security context: the container's settings over the pod's."""
    pod_sc = pod_spec.get("securityContext", {}) or {}
    sc = {**pod_sc, **(container.get("securityContext", {}) or {})}
    return {
        "run_as_user": sc.get("runAsUser"),
        "run_as_group": sc.get("runAsGroup"),
        "fs_group": pod_sc.get("fsGroup"),
        "read_only_root": bool(sc.get("readOnlyRootFilesystem")),
        "no_new_privileges": sc.get("allowPrivilegeEscalation") is False,
        "cap_drop": list((sc.get("capabilities") or {}).get("drop", [])),
    }


def _resource_fields(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The PodSpec fields docker can enforce: memory limit, CPU request, GPUs, the grace period."""
    resources = container.get("resources", {}) or {}
    limits, requests = resources.get("limits", {}) or {}, resources.get("requests", {}) or {}
    return {
        "memory_limit": limits.get("memory"),
        "cpu_request": str(requests["cpu"]) if "cpu" in requests else None,
        "gpus": sum(int(v) for k, v in limits.items() if k.split("/")[0] in GPU_VENDORS),
        "grace_seconds": int(pod_spec.get("terminationGracePeriodSeconds", 30)),
    }


def statefulset_pods(
    objects: list[dict[str, Any]], namespace: str, pod_ips: Callable[[str], str], node_name: str = "e2e-node"
) -> list[PodSpec]:
    """One PodSpec per StatefulSet replica; `pod_ips(pod_name)` gives each pod its address."""
    configmaps = configmaps_of(objects)
    pods = []
    for sts in (o for o in objects if o.get("kind") == "StatefulSet"):
        spec = sts["spec"]
        for ordinal in range(int(spec.get("replicas", 1))):
            name = f"{sts['metadata']['name']}-{ordinal}"
            pods.append(
                pod_from_template(
                    spec["template"],
                    name=name,
                    owner=sts["metadata"]["name"],
                    ordinal=ordinal,
                    namespace=namespace,
                    service=spec["serviceName"],
                    pod_ip=pod_ips(name),
                    configmaps=configmaps,
                    node_name=node_name,
                )
            )
    return pods


def _mount(m: dict[str, Any], volumes: dict[str, dict[str, Any]], configmaps) -> Mount:
    vol = volumes[m["name"]]
    read_only = bool(m.get("readOnly", False))
    if "configMap" in vol:
        data = configmaps[vol["configMap"]["name"]]
        items = vol["configMap"].get("items")
        files = {i["path"]: data[i["key"]] for i in items} if items else dict(data)
        return Mount(m["mountPath"], "configMap", True, files=files)
    if "emptyDir" in vol:
        ed = vol["emptyDir"] or {}
        return Mount(m["mountPath"], "emptyDir", read_only, medium=ed.get("medium", ""), size_limit=ed.get("sizeLimit"))
    if "persistentVolumeClaim" in vol:
        pvc = vol["persistentVolumeClaim"]
        return Mount(m["mountPath"], "pvc", read_only or bool(pvc.get("readOnly")), claim=pvc["claimName"])
    raise SpecError(f"volume {m['name']}: only configMap, emptyDir and persistentVolumeClaim are supported")
