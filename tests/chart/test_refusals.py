"""values.schema.json and the chart's own checks refuse bad values at render time, each with a message
naming the value: what the API server, the JobSet webhook or the launcher would refuse later (a pod
exiting 2 at start-up, a Job the controller cannot create) fails `helm template` instead.
"""

from __future__ import annotations

import pytest
from maskrcnn_launcher import contract

from .conftest import CHART, RELEASE, load_manifests
from .objects import VOLUME, pod_templates, trainer
from .validate import validate_kubernetes_objects

pytestmark = pytest.mark.needs_helm

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
    # Workload and JobSet values.
    ("workload=deployment", "/workload"),
    ("jobset.failurePolicy.maxRestarts=-1", "/jobset/failurePolicy/maxRestarts"),
    ("jobset.failurePolicy.restartStrategy=InPlaceRestart", "/jobset/failurePolicy/restartStrategy"),
    ("jobset.ttlSecondsAfterFinished=-5", "/jobset/ttlSecondsAfterFinished"),
    ("jobset.maxRestarts=3", "/jobset"),
    # Cluster knobs.
    ("image.digest=latest", "/image/digest"),
    ("gpuResourceName=gpu", "/gpuResourceName"),
    ("podLabels.team=a b", "/podLabels/team"),
    ("serviceAccount.token=true", "/serviceAccount"),
    ("podDisruptionBudget.minAvailable=1", "/podDisruptionBudget"),
    ("extraVolumeMounts[0].name=x", "/extraVolumeMounts/0"),
    ("extraEnv[0].name=OMP_NUM_THREADS,extraEnv[0].value=4", "/extraEnv/0/value"),
    # A GPU count set by hand beside the chart's own (CPU pods that would get a GPU the topology ignores).
    ("worker.resources.limits.nvidia\\.com/gpu=1", "worker.resources.limits.nvidia.com/gpu is set by hand"),
    ("master.resources.requests.amd\\.com/gpu=1", "master.resources.requests.amd.com/gpu is set by hand"),
    (
        "worker.gpus=2,gpuResourceName=amd.com/gpu,worker.resources.limits.amd\\.com/gpu=2",
        "worker.resources.limits.amd.com/gpu is set by hand",
    ),
    # TensorPipe device maps move CUDA tensors.
    ("pipeline.transport=device_maps", "pipeline.transport=device_maps needs GPUs: worker.gpus is 0"),
    # estimate only feeds the printed plan: what would stop the pods, or is no estimate input, is refused.
    ("estimate.micro_batches=4", "estimate.micro_batches (4) exceeds estimate.batch_size (2)"),
    ("estimate.batch_size=2,estimate.micro_batches=3", "estimate.micro_batches (3) exceeds estimate.batch_size (2)"),
    ("estimate.replicas=2", "/estimate"),
    ("estimate.master_port=1", "/estimate"),
    ("estimate.feature_dtype=float16", "/estimate/feature_dtype"),
    # Names and paths of the chart's own volumes.
    (
        "extraVolumes[0].name=data,extraVolumes[0].emptyDir=null",
        "extraVolumes[0].name=data clashes with a volume of the chart",
    ),
    (
        "extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/tmp",
        "extraVolumeMounts[0].mountPath=/tmp clashes with a mount of the chart",
    ),
    (
        "extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/data/",
        "extraVolumeMounts[0].mountPath=/data/ clashes with a mount of the chart",
    ),
    # Paths compare cleaned; the topology folder is a read-only ConfigMap mount; the data volume's own path.
    (f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=//tmp", "mountPath=//tmp clashes"),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/tmp/../data",
        "mountPath=/tmp/../data clashes",
    ),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/etc/maskrcnn/topology.yaml",
        "extraVolumeMounts[0].mountPath=/etc/maskrcnn/topology.yaml lies inside the read-only topology folder",
    ),
    ("storage.mountPath=/tmp", "storage.mountPath=/tmp clashes with a mount of the chart"),
    ("storage.mountPath=/dev/shm/", "storage.mountPath=/dev/shm/ clashes with a mount of the chart"),
    # Mounts of no volume, twice the same volume or path: the API server (or, for a JobSet, the Job
    # controller long after install) would refuse them.
    (
        "extraVolumeMounts[0].name=nosuch,extraVolumeMounts[0].mountPath=/v",
        "extraVolumeMounts[0].name=nosuch names no volume",
    ),
    (f"{VOLUME},extraVolumes[1].name=v,extraVolumes[1].emptyDir=null", "extraVolumes[1].name=v: another extra volume"),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/v,"
        "extraVolumeMounts[1].name=v,extraVolumeMounts[1].mountPath=/v/",
        "extraVolumeMounts[1].mountPath=/v/: another extra mount has this path",
    ),
    # Misspelt keys of an EnvVar or a VolumeMount would be dropped by the API server.
    ("extraEnv[0].name=FOO,extraEnv[0].valeu=bar", "/extraEnv/0"),
    (
        f"{VOLUME},extraVolumeMounts[0].name=v,extraVolumeMounts[0].mountPath=/v,extraVolumeMounts[0].readonly=true",
        "/extraVolumeMounts/0",
    ),
    (
        "extraEnv[0].name=FOO,extraEnv[0].value=x,extraEnv[0].valueFrom.fieldRef.fieldPath=metadata.name",
        "extraEnv[0] (FOO) has both value and valueFrom",
    ),
    # The chart's labels (selectors) and annotations (topology checksum), and the JobSet keys the launcher reads.
    ("podLabels.app\\.kubernetes\\.io/component=x", "podLabels.app.kubernetes.io/component: the chart sets this label"),
    ("podLabels.app\\.kubernetes\\.io/instance=x", "podLabels.app.kubernetes.io/instance: the chart sets this label"),
    ("podLabels.helm\\.sh/chart=x", "podLabels.helm.sh/chart: the chart sets this label"),
    (
        "podLabels.jobset\\.sigs\\.k8s\\.io/replicatedjob-name=x",
        "podLabels.jobset.sigs.k8s.io/replicatedjob-name: the chart sets this label",
    ),
    ("podAnnotations.checksum/topology=x", "podAnnotations.checksum/topology: the chart or the JobSet controller"),
    ("worker.podAnnotations.checksum/topology=x", "worker.podAnnotations.checksum/topology: the chart or the JobSet"),
    (
        "master.podAnnotations.batch\\.kubernetes\\.io/job-completion-index=x",
        "master.podAnnotations.batch.kubernetes.io/job-completion-index: the chart or the JobSet controller",
    ),
    # What the trainer would refuse in every pod at start-up: an option given twice, --elastic beside jobset.elastic.
    ("trainer.args={--lr,0.01,--lr=0.02}", "trainer.args gives --lr more than once (--lr, then --lr=0.02)"),
    ("trainer.args={--amp,--no-amp}", "trainer.args gives --amp more than once (--amp, then --no-amp)"),
    (
        "engine=ddp,workload=jobset,jobset.elastic.enabled=true,trainer.args={--no-elastic}",
        "trainer.args: --no-elastic beside jobset.elastic.enabled",
    ),
    # A name the API server refuses for the pods (for a JobSet: only once the Job controller makes them).
    ("priorityClassName=High_Priority", "/priorityClassName"),
]


@pytest.mark.parametrize(("setting", "message"), BAD_VALUES)
def test_bad_values_are_rejected_with_a_clear_message(run_helm, setting: str, message: str) -> None:
    proc = run_helm("template", RELEASE, str(CHART), "--set", setting)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    if message.startswith("/"):
        assert names_schema_path(proc.stderr, *message[1:].split("/")), proc.stderr
    else:
        assert message in proc.stderr, proc.stderr


def names_schema_path(stderr: str, *keys: str) -> bool:
    """Whether a schema error names the value at `keys` ("worker", "gpus"), as helm 4 says it (a JSON
    pointer, '/worker/gpus', a "/" in a key written "~1") or helm 3 (worker.gpus)."""
    pointer = "/" + "/".join(key.replace("~", "~0").replace("/", "~1") for key in keys)
    return f"'{pointer}'" in stderr or ".".join(keys) in stderr


# (value, whether it is a Kubernetes quantity), as apimachinery's resource.ParseQuantity has it
# (parseQuantityString, then the suffix: a binary or decimal SI one, or "e"/"E" and an integer), and
# not negative (the API server refuses a negative request or limit). The chart checks it at render
# time, where the API server would refuse the pods later, or for a JobSet only when the Job
# controller makes them.
QUANTITIES = [
    ("100m", True),
    ("0.5", True),
    (0.5, True),
    (2, True),
    ("2", True),
    ("0", True),
    ("1.5Gi", True),
    ("512Mi", True),
    ("4G", True),
    ("64k", True),
    ("250u", True),
    ("10n", True),
    ("1e3", True),
    ("1E3", True),
    ("1e-3", True),
    ("2E", True),  # two exa: E alone is the decimal suffix
    ("+1", True),
    (".5", True),
    ("1.", True),
    ("2 cores", False),
    ("4GB", False),
    ("1gi", False),
    ("1K", False),  # kilo is k; K only begins Ki
    ("1KB", False),
    ("1Mi3", False),
    ("-1", False),
    (-1, False),
    (-0.5, False),
    ("", False),
    (" 1", False),
    ("1 ", False),
    ("1.5.5", False),
    ("e3", False),
    ("1e", False),
    ("Gi", False),
    ("1,5", False),
    ("0x10", False),
    (True, False),
]
# Where each case is set, in turn: requests and limits of both roles, every kind of resource.
RESOURCE_FIELDS = [
    ("worker", "requests", "cpu"),
    ("master", "limits", "memory"),
    ("worker", "limits", "ephemeral-storage"),
    ("master", "requests", "cpu"),
    ("worker", "requests", "memory"),
    ("master", "limits", "example.com/fpga"),
]


@pytest.mark.parametrize(("index", "value", "valid"), [(i, v, ok) for i, (v, ok) in enumerate(QUANTITIES)])
def test_resource_quantities_are_checked_at_render_time(template_values, index: int, value, valid: bool) -> None:
    role, section, name = RESOURCE_FIELDS[index % len(RESOURCE_FIELDS)]
    proc = template_values({role: {"resources": {section: {name: value}}}})
    if not valid:
        assert proc.returncode != 0, f"{role}.resources.{section}.{name}={value!r} was accepted"
        assert names_schema_path(proc.stderr, role, "resources", section, name), proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    objects = load_manifests(proc.stdout)
    assert trainer(pod_templates(objects)[role])["resources"][section][name] == value
    validate_kubernetes_objects(objects)


def test_schema_errors_read_well_with_the_pinned_helm(run_helm) -> None:
    proc = run_helm("version", "--short")
    if not proc.stdout.startswith("v4."):
        pytest.skip(f"message wording checked for helm 4 only, this is {proc.stdout.strip()}")
    proc = run_helm("template", RELEASE, str(CHART), "--set", "worker.gpus=-1", "--set", "engine=horovod")
    assert "at '/worker/gpus': minimum: got -1, want 0" in proc.stderr
    assert "at '/engine': value must be one of 'pipeline', 'ddp'" in proc.stderr


def contract_env_names() -> list[str]:
    """Every variable of the launcher's environment contract a user may not set through extraEnv."""
    return sorted(
        set(contract.READ_VARS + contract.TRAINER_READ_VARS + contract.EXPORTED_VARS) - set(contract.USER_ENV_VARS)
    )


@pytest.mark.parametrize("name", [*contract_env_names(), "MASKRCNN_WAIT_TIMOUT"])
def test_extra_env_may_not_redefine_the_contract(run_helm, name: str) -> None:
    proc = run_helm(
        "template", RELEASE, str(CHART), "--set", "extraEnv[0].name=NCCL_DEBUG", "--set", f"extraEnv[1].name={name}"
    )
    assert proc.returncode != 0, f"extraEnv {name} was accepted"
    assert f"extraEnv[1].name={name}: {name} belongs to the launcher's environment contract" in proc.stderr


@pytest.mark.parametrize("name", [*contract.USER_ENV_VARS, "NCCL_DEBUG", "OMP_NUM_THREADS"])
def test_extra_env_takes_the_user_settings(render, name: str) -> None:
    for template in pod_templates(render("cpu", f"extraEnv[0].name={name}", "extraEnv[0].value=x")).values():
        assert {"name": name, "value": "x"} in trainer(template)["env"]
