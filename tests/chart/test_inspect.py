"""`inspect.enabled`: a release that is only the volume and one idle pod on it, the window the cluster
walkthrough (docs/cluster-walkthrough.md) uses to put a dataset on the claim before a run and to take
a finished run's checkpoints and metrics off it after the JobSet's pods are gone.
"""

from __future__ import annotations

import pytest
import yaml

from .conftest import CHART, RELEASE, SCENARIOS
from .objects import by_kind, one
from .validate import validate_kubernetes_objects

pytestmark = pytest.mark.needs_helm

CLAIM = "coco-data"


@pytest.mark.parametrize("jobset_api", [False, True])
@pytest.mark.parametrize("scenario", ["default", "gpu-3-machines", "jobset", "ddp"])
def test_an_inspect_release_is_the_claim_and_one_pod_on_it(render, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, "inspect.enabled=true", jobset_api=jobset_api)
    validate_kubernetes_objects(objects)
    kinds = sorted(o["kind"] for o in objects if o["kind"] not in ("ServiceAccount", "PersistentVolumeClaim"))
    assert kinds == ["Pod"], kinds  # no training pods, ConfigMap, Service, NetworkPolicy or helm test
    pod = one(objects, "Pod")
    values = yaml.safe_load(SCENARIOS[scenario].read_text()) if SCENARIOS[scenario] else {}
    existing = values.get("storage", {}).get("existingClaim")
    claims = [c["metadata"]["name"] for c in by_kind(objects, "PersistentVolumeClaim")]
    assert claims == ([] if existing else [f"{RELEASE}-maskrcnn-dist-data"])
    claim = existing or claims[0]
    assert pod["metadata"]["name"] == f"{RELEASE}-maskrcnn-dist-inspect"
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": claim}  # read-write
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/data"].get("readOnly") and container["workingDir"] == "/data"
    # The training pods' security: non-root, read-only root, writable /tmp and HOME as emptyDirs.
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"/tmp", "/home/maskrcnn"} <= set(mounts) and all("emptyDir" in volumes[n] for n in ("tmp", "home"))
    # Idle, stopped at once by SIGTERM (dumb-init passes it on to sleep), and no GPU.
    assert container["command"] == ["dumb-init", "--", "sleep", "infinity"]
    assert not any("gpu" in name for name in container.get("resources", {}).get("limits", {}))


def test_an_inspect_release_mounts_an_existing_claim(render) -> None:
    objects = render("default", "inspect.enabled=true", f"storage.existingClaim={CLAIM}")
    assert not by_kind(objects, "PersistentVolumeClaim")
    (pod,) = by_kind(objects, "Pod")
    assert {"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}} in pod["spec"]["volumes"]


def test_the_kept_claim_of_an_inspect_release_is_the_one_a_training_release_names(render) -> None:
    """The walkthrough: an inspect release `data` makes the claim, a training release names it."""
    made = one(render("default", "inspect.enabled=true", release="data"), "PersistentVolumeClaim")
    assert made["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    name = made["metadata"]["name"]
    training = render("default", f"storage.existingClaim={name}", release="coco")
    (master,) = [s for s in by_kind(training, "StatefulSet") if s["metadata"]["name"].endswith("-master")]
    volumes = master["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": name, "readOnly": False}} in volumes


def test_inspect_and_the_kubeflow_runtime_are_refused_together(run_helm) -> None:
    proc = run_helm(
        "template",
        RELEASE,
        str(CHART),
        "-f",
        str(CHART / "ci" / "kubeflow-values.yaml"),
        "--set",
        "inspect.enabled=true",
    )
    assert proc.returncode != 0 and "inspect.enabled and kubeflowTrainer.runtime.enabled" in proc.stderr
