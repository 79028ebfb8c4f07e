"""The training pod, one template for both workloads: the launcher's environment contract, the
container's arguments, GPUs, shared memory, storage, extra volumes and the scheduling knobs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from maskrcnn_launcher.contract import JOBSET_FIELDS, POD_ENV_VARS, TERMINATION_GRACE_SECONDS, TRAINER_READ_VARS

from .conftest import RELEASE
from .objects import (
    CASE_IDS,
    CASES,
    GPU,
    SCENARIO_NAMES,
    by_kind,
    helm_test_pod,
    one,
    pod_labels,
    pod_templates,
    selects,
    statefulsets,
    trainer,
    workload,
)

pytestmark = pytest.mark.needs_helm


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_env_names_equal_the_launcher_contract(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    extra = {e["name"] for e in values(scenario).get("extraEnv") or []}
    jobset = workload(objects) == "jobset"
    for role, template in pod_templates(objects).items():
        names = [e["name"] for e in trainer(template)["env"]]
        assert len(names) == len(set(names)), f"{role}: duplicate env names {names}"
        # What the launcher and the trainer read from the pod spec, and the JobSet identity.
        expected = set(POD_ENV_VARS) | set(TRAINER_READ_VARS) | (set(JOBSET_FIELDS) if jobset else set())
        assert set(names) - extra == expected, f"{role}: chart sets {sorted(set(names) - extra)}"


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_identity_env_values(render, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    service = one(objects, "Service")
    jobset = workload(objects) == "jobset"
    for role, template in pod_templates(objects).items():
        env = {e["name"]: e for e in trainer(template)["env"]}
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["MASKRCNN_HEADLESS_SERVICE"]["value"] == service["metadata"]["name"]
        if jobset:
            assert env["MASKRCNN_HEADLESS_SERVICE"]["value"] == one(objects, "JobSet")["spec"]["network"]["subdomain"]
            for name, field in JOBSET_FIELDS.items():
                assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == field, (role, name)
        else:
            assert env["MASKRCNN_HEADLESS_SERVICE"]["value"] == statefulsets(objects)[role]["spec"]["serviceName"]
        # The topology path lies in the ConfigMap's mount and names its key.
        spec = template["spec"]
        (volume,) = [v for v in spec["volumes"] if "configMap" in v]
        (mount,) = [m for m in trainer(template)["volumeMounts"] if m["name"] == volume["name"]]
        assert env["MASKRCNN_TOPOLOGY"]["value"] == f"{mount['mountPath']}/topology.yaml", role
        assert mount.get("readOnly") is True


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("grace", [None, "7"])
def test_the_trainer_gets_the_pods_grace_period(render, scenario: str, jobset_api: bool, grace: str | None) -> None:
    """One value, terminationGracePeriodSeconds: the kubelet's SIGKILL deadline and the trainer's
    budget for a step and a checkpoint write after SIGTERM."""
    sets = (f"terminationGracePeriodSeconds={grace}",) if grace else ()
    for role, template in pod_templates(render(scenario, *sets, jobset_api=jobset_api)).items():
        seconds = template["spec"]["terminationGracePeriodSeconds"]
        assert grace is None or seconds == int(grace)
        env = {e["name"]: e for e in trainer(template)["env"]}
        assert env[TERMINATION_GRACE_SECONDS] == {"name": TERMINATION_GRACE_SECONDS, "value": str(seconds)}, role


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_one_pod_template_for_both_workloads(render, scenario: str) -> None:
    """The JobSet's pods are the StatefulSets' pods (one definition in _pod.tpl), except what a
    Job needs: restartPolicy Never, and the JobSet identity variables."""
    sts = pod_templates(render(scenario, "workload=statefulset"))
    jobset = pod_templates(render(scenario, "workload=jobset"))
    for role in ("master", "worker"):
        job_pod = yaml.safe_load(yaml.safe_dump(jobset[role]))
        assert job_pod["spec"].pop("restartPolicy") == "Never"
        env = trainer(job_pod)["env"]
        trainer(job_pod)["env"] = [e for e in env if e["name"] not in JOBSET_FIELDS]
        assert job_pod == sts[role], role


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_container_runs_the_launcher_with_known_trainer_flags(render, scenario: str, jobset_api: bool) -> None:
    # The trainer's flags are generated from this table; a renamed flag breaks the chart's values.
    from maskrcnn_dist.config import BY_FLAG

    for role, template in pod_templates(render(scenario, jobset_api=jobset_api)).items():
        container = trainer(template)
        assert "command" not in container, "the image's entrypoint (dumb-init -> launcher) must stay"
        args = container["args"]
        assert args[:4] == ["launch", "--topology", "$(MASKRCNN_TOPOLOGY)", "--"], role
        for arg in args[4:]:
            if arg.startswith("--"):
                flag = arg[2:]
                assert flag in BY_FLAG or (flag.startswith("no-") and flag[3:] in BY_FLAG), f"unknown flag {arg}"


@pytest.mark.parametrize("jobset_api", [False, True])
def test_gpu_resource_name_and_its_toleration(render, jobset_api: bool) -> None:
    """gpuResourceName renders the limits (nvidia.com/gpu, amd.com/gpu, a MIG profile), and pods with
    GPUs tolerate that resource's NoSchedule taint, once, beside the role's own tolerations."""
    for resource in ("amd.com/gpu", "nvidia.com/mig-1g.10gb"):
        templates = pod_templates(render("ddp", f"gpuResourceName={resource}", jobset_api=jobset_api))
        taint = {"key": resource, "operator": "Exists", "effect": "NoSchedule"}
        for role, template in templates.items():
            assert trainer(template)["resources"]["limits"] == {"memory": "64Gi", resource: 2}, role
            tolerations = template["spec"]["tolerations"]
            assert tolerations.count(taint) == 1 and tolerations[0] == {**taint, "key": GPU}, (role, tolerations)
    # The scenario's own toleration already is the GPU one: not added twice.
    for role, template in pod_templates(render("ddp", jobset_api=jobset_api)).items():
        assert template["spec"]["tolerations"] == [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}], role
    # CPU pods get none, and the toleration can be left to the roles' own values.
    assert "tolerations" not in pod_templates(render("cpu", jobset_api=jobset_api))["worker"]["spec"]
    templates = pod_templates(render("jobset", "gpuToleration=false", jobset_api=jobset_api))
    assert all("tolerations" not in t["spec"] for t in templates.values())


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_dev_shm_is_a_memory_emptydir_with_a_size_limit(render, scenario: str, jobset_api: bool) -> None:
    for role, template in pod_templates(render(scenario, jobset_api=jobset_api)).items():
        (mount,) = [m for m in trainer(template)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
        assert volume["emptyDir"]["medium"] == "Memory", role
        assert volume["emptyDir"]["sizeLimit"], role


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_storage_mounts(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    v = values(scenario)
    templates = pod_templates(objects)
    claims = by_kind(objects, "PersistentVolumeClaim")
    claim = v["storage"]["existingClaim"] or f"{RELEASE}-maskrcnn-dist-data"
    assert [c["metadata"]["name"] for c in claims] == ([] if v["storage"]["existingClaim"] else [claim])

    def data_mount(role: str) -> dict[str, Any] | None:
        mounts = [m for m in trainer(templates[role])["volumeMounts"] if m["mountPath"] == v["storage"]["mountPath"]]
        vols = [x for x in templates[role]["spec"]["volumes"] if "persistentVolumeClaim" in x]
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


@pytest.mark.parametrize("jobset_api", [False, True])
def test_extra_volumes_reach_every_training_pod(render, values, jobset_api: bool) -> None:
    v = values("jobset")
    objects = render("jobset", "workload=auto", jobset_api=jobset_api)
    for role, template in pod_templates(objects).items():
        names = {vol["name"] for vol in template["spec"]["volumes"]}
        assert names >= {vol["name"] for vol in v["extraVolumes"]}, role
        mounts = trainer(template)["volumeMounts"]
        assert [m for m in mounts if m["name"] in {x["name"] for x in v["extraVolumeMounts"]}] == v["extraVolumeMounts"]
    assert "dataset-credentials" not in json.dumps(helm_test_pod(objects)), "the helm test pod needs none"


@pytest.mark.parametrize("jobset_api", [False, True])
def test_spread_across_nodes_keeps_training_pods_apart(render, values, jobset_api: bool) -> None:
    for scenario in ("gpu-3-machines", "ddp", "jobset"):
        assert values(scenario)["spreadAcrossNodes"] is True
        objects = render(scenario, jobset_api=jobset_api)
        labels = pod_labels(objects)
        for role, template in pod_templates(objects).items():
            affinity = template["spec"]["affinity"]
            terms = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            (term,) = [t for t in terms if t["topologyKey"] == "kubernetes.io/hostname"]
            assert selects(term["labelSelector"], labels["master"]) and selects(term["labelSelector"], labels["worker"])
            assert not selects(term["labelSelector"], labels["test"]), role
            # The role's own affinity survives the merge.
            own = values(scenario)[role].get("affinity") or {}
            for key, value in own.items():
                assert affinity[key] == value
    for role, template in pod_templates(render("cpu", jobset_api=jobset_api)).items():
        assert "affinity" not in template["spec"], role


@pytest.mark.parametrize("jobset_api", [False, True])
def test_scheduling_knobs_reach_the_pod_specs(render, values, jobset_api: bool) -> None:
    for scenario in ("gpu-3-machines", "jobset"):
        v = values(scenario)
        objects = render(scenario, jobset_api=jobset_api)
        for role, template in pod_templates(objects).items():
            spec = template["spec"]
            assert spec["priorityClassName"] == v["priorityClassName"]
            assert spec.get("runtimeClassName") == (v["runtimeClassName"] or None)
            assert spec["imagePullSecrets"] == v["imagePullSecrets"]
            assert spec.get("nodeSelector", {}) == v[role]["nodeSelector"]
            assert v[role]["tolerations"] == spec.get("tolerations", [])[: len(v[role]["tolerations"])]
            image = v["image"]
            pinned = f"{image['repository']}@{image['digest']}" if image.get("digest") else None
            assert trainer(template)["image"] == (pinned or f"{image['repository']}:{image['tag']}")
            assert template["metadata"]["labels"].items() >= v["podLabels"].items(), role
            annotations = template["metadata"]["annotations"]
            assert annotations.items() >= {**v["podAnnotations"], **v[role]["podAnnotations"]}.items(), role
    # schedulerName: e.g. a gang scheduler for the StatefulSets.
    for template in pod_templates(render("cpu", "schedulerName=volcano", jobset_api=jobset_api)).values():
        assert template["spec"]["schedulerName"] == "volcano"
    assert "schedulerName" not in pod_templates(render("cpu", jobset_api=jobset_api))["master"]["spec"]


def test_image_digest_pins_the_image(render) -> None:
    digest = "sha256:" + "ab" * 32
    objects = render("cpu", f"image.digest={digest}", "image.tag=ignored")
    images = {trainer(t)["image"] for t in pod_templates(objects).values()} | {
        helm_test_pod(objects)["spec"]["containers"][0]["image"]
    }
    assert images == {f"maskrcnn-dist@{digest}"}
