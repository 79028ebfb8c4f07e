"""The chart's rendered pods, as the kubelet would start them: `helm template` -> `PodSpec`s.

Nothing here is hand-written per pod: names, environment, command, arguments, mounts, security
context and resources all come from the StatefulSets (and the topology ConfigMap) that
`helm template` renders. What the API server and the kubelet would add is added the way they do:

* one pod per StatefulSet ordinal, named `<statefulset>-<ordinal>`, hostname = pod name,
  DNS `<pod>.<serviceName>.<namespace>.svc.<cluster domain>`;
* downward-API environment (`fieldRef`: metadata.name, metadata.namespace, status.podIP, ...)
  becomes literal values;
* `$(VAR)` references in env values, command and args are expanded like the kubelet's
  third_party/forked/golang/expansion: defined variables are replaced, `$$` is a literal `$`,
  unknown references stay as written.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm"


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
    """One StatefulSet pod's single container, ready to become a `docker run`."""

    name: str  # <statefulset>-<ordinal>
    statefulset: str
    ordinal: int
    component: str  # the app.kubernetes.io/component label: master or worker
    namespace: str
    service: str  # the StatefulSet's serviceName (the headless Service)
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

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{self.service}.{self.namespace}.svc.{self.cluster_domain}"

    @property
    def dns_names(self) -> list[str]:
        """The names cluster DNS answers for this pod (with the pod's search path), and the Service's."""
        svc = f"{self.service}.{self.namespace}.svc.{self.cluster_domain}"
        return [
            f"{self.name}.{self.service}",
            f"{self.name}.{self.service}.{self.namespace}",
            f"{self.name}.{self.service}.{self.namespace}.svc",
            self.fqdn,
            self.service,
            f"{self.service}.{self.namespace}",
            svc,
        ]

    @property
    def dns_search(self) -> list[str]:
        d = self.cluster_domain
        return [f"{self.namespace}.svc.{d}", f"svc.{d}", d]


@dataclass
class Release:
    """What `helm template` rendered: the pods in StatefulSet order, and every object by kind/name."""

    name: str
    namespace: str
    pods: list[PodSpec]
    objects: list[dict[str, Any]]

    def pod(self, component: str, ordinal: int = 0) -> PodSpec:
        for p in self.pods:
            if p.component == component and p.ordinal == ordinal:
                return p
        raise KeyError(f"no {component} pod with ordinal {ordinal} in {[p.name for p in self.pods]}")

    @property
    def master(self) -> PodSpec:
        return self.pod("master")

    @property
    def workers(self) -> list[PodSpec]:
        return sorted((p for p in self.pods if p.component == "worker"), key=lambda p: p.ordinal)


def helm_template(
    helm: str, release: str, namespace: str, values_files: Sequence[Path], chart: Path = CHART, timeout: float = 120
) -> list[dict[str, Any]]:
    cmd = [helm, "template", release, str(chart), "--namespace", namespace]
    for path in values_files:
        cmd += ["-f", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SpecError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


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
    for prefix, source in (("metadata.labels", meta.get("labels", {})), ("metadata.annotations", {})):
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


def pods_from_objects(
    objects: list[dict[str, Any]], namespace: str, pod_ips: Callable[[str], str], node_name: str = "e2e-node"
) -> list[PodSpec]:
    """One PodSpec per StatefulSet replica; `pod_ips(pod_name)` gives each pod its address."""
    configmaps = {
        o["metadata"]["name"]: {k: str(v) for k, v in (o.get("data") or {}).items()}
        for o in objects
        if o.get("kind") == "ConfigMap"
    }
    pods = []
    for sts in (o for o in objects if o.get("kind") == "StatefulSet"):
        spec = sts["spec"]
        template = spec["template"]
        pod_spec = template["spec"]
        containers = pod_spec["containers"]
        if len(containers) != 1 or pod_spec.get("initContainers"):
            raise SpecError(f"StatefulSet {sts['metadata']['name']}: the harness runs exactly one container per pod")
        (container,) = containers
        volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
        for ordinal in range(int(spec.get("replicas", 1))):
            name = f"{sts['metadata']['name']}-{ordinal}"
            pod = {
                "metadata": {"name": name, "namespace": namespace, "labels": template["metadata"].get("labels", {})},
                "podIP": pod_ips(name),
                "hostIP": pod_ips(name),
                "nodeName": node_name,
                "serviceAccountName": pod_spec.get("serviceAccountName", "default"),
            }
            env = container_env(container, pod, configmaps)
            lookup = env.get
            pod_sc = pod_spec.get("securityContext", {}) or {}
            sc = {**pod_sc, **(container.get("securityContext", {}) or {})}
            resources = container.get("resources", {}) or {}
            limits, requests = resources.get("limits", {}) or {}, resources.get("requests", {}) or {}
            pods.append(
                PodSpec(
                    name=name,
                    statefulset=sts["metadata"]["name"],
                    ordinal=ordinal,
                    component=template["metadata"].get("labels", {}).get("app.kubernetes.io/component", ""),
                    namespace=namespace,
                    service=spec["serviceName"],
                    cluster_domain=env.get("MASKRCNN_CLUSTER_DOMAIN", "cluster.local"),
                    image=container["image"],
                    command=[expand(str(c), lookup) for c in container["command"]] if "command" in container else None,
                    args=[expand(str(a), lookup) for a in container.get("args", [])],
                    env=env,
                    mounts=[_mount(m, volumes, configmaps) for m in container.get("volumeMounts", [])],
                    pod_ip=pod["podIP"],
                    run_as_user=sc.get("runAsUser"),
                    run_as_group=sc.get("runAsGroup"),
                    fs_group=pod_sc.get("fsGroup"),
                    read_only_root=bool(sc.get("readOnlyRootFilesystem")),
                    no_new_privileges=sc.get("allowPrivilegeEscalation") is False,
                    cap_drop=list((sc.get("capabilities") or {}).get("drop", [])),
                    memory_limit=limits.get("memory"),
                    cpu_request=str(requests["cpu"]) if "cpu" in requests else None,
                    gpus=int(limits.get("nvidia.com/gpu", 0)),
                    grace_seconds=int(pod_spec.get("terminationGracePeriodSeconds", 30)),
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


def render_release(
    helm: str, release: str, namespace: str, values_files: Sequence[Path], pod_ips: Callable[[str], str]
) -> Release:
    objects = helm_template(helm, release, namespace, values_files)
    return Release(release, namespace, pods_from_objects(objects, namespace, pod_ips), objects)
