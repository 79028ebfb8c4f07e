"""helm lint, every rendered object against the Kubernetes schemas (every scenario and every knob, in
both workloads), and k8s/ (`make manifests`) in sync with the chart.
"""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from .conftest import CHART, ROOT, SCENARIOS, load_manifests, values_args
from .objects import CASE_IDS, CASES, SCENARIO_NAMES, VOLUME, by_kind, topology_of, workload
from .validate import validate_jobset, validate_kubernetes, validate_kubernetes_objects

pytestmark = pytest.mark.needs_helm


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
@pytest.mark.parametrize("workload_value", ["auto", "jobset"])
def test_helm_lint(run_helm, scenario: str, workload_value: str) -> None:
    # helm lint has no --api-versions; workload=jobset lints the JobSet form.
    proc = run_helm("lint", "--strict", str(CHART), *values_args(SCENARIOS[scenario], (f"workload={workload_value}",)))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_rendered_key_given_twice_is_an_error() -> None:
    """Every render is read with unique keys (conftest.load_manifests): a label or annotation of the
    user's rendered beside the chart's own one would otherwise pass with one of them lost."""
    assert load_manifests("a: 1\nb: {c: 1}\n") == [{"a": 1, "b": {"c": 1}}]
    with pytest.raises(yaml.constructor.ConstructorError, match="found the key 'app' twice"):
        load_manifests("metadata:\n  labels:\n    app: x\n    app: y\n")


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_every_object_validates_against_kubernetes_schemas(render, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    assert {o["kind"] for o in objects} >= {"Service", "ConfigMap", "NetworkPolicy", "Pod"}
    validate_kubernetes_objects(objects)


KNOBS: dict[str, tuple[str, ...]] = {
    "kueue": ("podLabels.kueue\\.x-k8s\\.io/queue-name=team-a", "podAnnotations.example\\.com/owner=vision"),
    "scheduling": ("schedulerName=volcano", "priorityClassName=high", "runtimeClassName=nvidia"),
    "tolerations": (
        "master.tolerations[0].key=dedicated,master.tolerations[0].operator=Exists",
        "spreadAcrossNodes=true",
    ),
    "mig": ("worker.gpus=1", "gpuResourceName=nvidia.com/mig-1g.10gb", "pipeline.transport=device_maps"),
    "amd": ("engine=ddp", "master.gpus=4", "worker.gpus=4", "gpuResourceName=amd.com/gpu"),
    "digest": ("image.digest=sha256:" + "0" * 64,),
    "created-account": ("serviceAccount.create=true", "serviceAccount.name=trainer"),
    "existing-account": ("serviceAccount.name=trainer",),
    "volumes": (
        VOLUME,
        "extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/v,extraVolumeMounts[0].readOnly=true",
    ),
    "env": (
        "extraEnv[0].name=MASKRCNN_DEBUG,extraEnv[0].value=yes",
        "extraEnv[1].name=TOKEN,extraEnv[1].valueFrom.secretKeyRef.name=s,extraEnv[1].valueFrom.secretKeyRef.key=k",
    ),
    "pdb": ("podDisruptionBudget.enabled=true",),
    "jobset-policy": (
        "jobset.ttlSecondsAfterFinished=0",
        "jobset.failurePolicy.maxRestarts=0",
        "jobset.failurePolicy.restartStrategy=Recreate",
    ),
    "claim": ("storage.existingClaim=coco", "networkPolicy.enabled=false", "storage.mountPath=/mnt/data"),
    "fullname": ("fullnameOverride=" + "f" * 40,),
    "ddp-master-alone": ("engine=ddp", "ddp.workers=0"),
    "ddp-8x4": ("engine=ddp", "ddp.workers=8", "master.gpus=4", "worker.gpus=4"),
    "network": ("network.interface=eth0", "network.clusterDomain=example.org", "network.masterPort=40000"),
}


@pytest.mark.parametrize("workload_value", ["statefulset", "jobset"])
@pytest.mark.parametrize("knob", list(KNOBS))
def test_every_knob_renders_valid_objects(render, jobset_schema, knob: str, workload_value: str) -> None:
    objects = render("default", *KNOBS[knob], f"workload={workload_value}")
    assert workload(objects) == workload_value
    validate_kubernetes_objects(objects)
    for jobset in by_kind(objects, "JobSet"):
        validate_jobset(jobset, jobset_schema)
    topology_of(objects)  # the launcher takes the topology


def _render_manifests_module():
    spec = importlib.util.spec_from_file_location("render_manifests", CHART / "hack" / "render_manifests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_k8s_manifests_are_in_sync_with_the_chart(helm: str) -> None:
    expected = _render_manifests_module().render(helm, CHART)
    folder = ROOT / "k8s"
    actual = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*.yaml")}
    assert sorted(actual) == sorted(expected), "k8s/ has other files than the chart renders: run `make manifests`"
    stale = [name for name in expected if actual[name] != expected[name]]
    assert not stale, f"k8s/{stale} differ from `helm template` of the chart: run `make manifests`"
    # And they are what the tests above check: every object valid, the test hook left out.
    for base in ("", "jobset/"):
        kustomization = yaml.safe_load(expected[f"{base}kustomization.yaml"])
        resources = sorted(
            n.removeprefix(base) for n in expected if n.startswith(base) and "/" not in n.removeprefix(base)
        )
        assert sorted(kustomization["resources"]) == [n for n in resources if n != "kustomization.yaml"]
        for name in kustomization["resources"]:
            for obj in yaml.safe_load_all(expected[base + name]):
                assert "helm.sh/hook" not in obj["metadata"].get("annotations", {})
                if obj["kind"] != "JobSet":
                    validate_kubernetes(obj, f"k8s/{base}{name}")
    assert "kind: JobSet" in expected["jobset/jobset.yaml"] and "kind: StatefulSet" not in "".join(
        text for name, text in expected.items() if name.startswith("jobset/")
    )
