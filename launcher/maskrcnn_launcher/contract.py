"""The environment contract between pod spec, launcher and trainer: the one file that owns it.

Like Kubeflow's `envvar.go`: every variable the launcher reads or exports is named here once, and
the record it hands the trainer (`PodPlan`, serialised into `MASKRCNN_POD_PLAN`) is defined here.
The Helm chart's test compares the rendered pod specs against `POD_ENV_VARS`; the trainer does

    from maskrcnn_launcher.contract import PodPlan
    plan = PodPlan.from_env()

Only the standard library is imported: the trainer imports this module next to torch, the launcher
without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from maskrcnn_launcher.errors import PlanFormatError

# ---------------------------------------------------------------------------------------------
# Variables the launcher reads.
# ---------------------------------------------------------------------------------------------

#: Path of the topology YAML (the chart mounts its ConfigMap there). Flag: `--topology`.
TOPOLOGY = "MASKRCNN_TOPOLOGY"
#: Explicit role on bare nodes: `master` or `worker`. Flag: `--role`. Beats the pod name.
ROLE = "MASKRCNN_ROLE"
#: Explicit 0-based index of the role (worker ordinal; the master is 0). Flag: `--index`.
INDEX = "MASKRCNN_INDEX"
#: StatefulSet pod name `<prefix>-master-0` / `<prefix>-worker-<i>` (downward API metadata.name).
POD_NAME = "POD_NAME"
#: Fallback for POD_NAME: a pod's hostname is its name in a StatefulSet.
HOSTNAME = "HOSTNAME"
#: Namespace of the pod (downward API metadata.namespace): part of the master's DNS name.
POD_NAMESPACE = "POD_NAMESPACE"
#: The pod's IP (downward API status.podIP): recorded in the plan for logs.
POD_IP = "POD_IP"
#: The headless Service (StatefulSet serviceName) that gives every pod a stable DNS name.
HEADLESS_SERVICE = "MASKRCNN_HEADLESS_SERVICE"
#: Cluster DNS domain; `DEFAULT_CLUSTER_DOMAIN` when unset.
CLUSTER_DOMAIN = "MASKRCNN_CLUSTER_DOMAIN"
#: Explicit master address (also exported). Flag: `--master-addr`. Beats the derived DNS name.
MASTER_ADDR = "MASTER_ADDR"
#: Explicit master port (also exported). Flag: `--master-port`. Beats the topology's port.
MASTER_PORT = "MASTER_PORT"
#: Replaces the trainer command (shell words); flag `--trainer-cmd`. For tests and custom images.
TRAINER_CMD = "MASKRCNN_TRAINER_CMD"
#: Seconds to wait for the master's DNS name and then its port. Flag: `--wait-timeout`.
WAIT_TIMEOUT = "MASKRCNN_WAIT_TIMEOUT"

# ---------------------------------------------------------------------------------------------
# Variables the launcher exports to the trainer (besides MASTER_ADDR and MASTER_PORT above).
# ---------------------------------------------------------------------------------------------

#: torchrun-compatible variables; for ddp, `torch.distributed.run` sets them per process itself.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
#: This pod's `PodPlan` as JSON.
POD_PLAN = "MASKRCNN_POD_PLAN"
#: Socket interface names, exported only when the topology names an interface.
TP_SOCKET_IFNAME = "TP_SOCKET_IFNAME"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
SOCKET_IFNAME_VARS = (TP_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)

#: What a pod spec (the chart, the plain manifests) must set. HOSTNAME is set by the kubelet and
#: the identity flags are for bare nodes, so neither is listed.
POD_ENV_VARS = (TOPOLOGY, POD_NAME, POD_NAMESPACE, POD_IP, HEADLESS_SERVICE, CLUSTER_DOMAIN)
#: Every variable the launcher reads.
READ_VARS = (
    TOPOLOGY,
    ROLE,
    INDEX,
    POD_NAME,
    HOSTNAME,
    POD_NAMESPACE,
    POD_IP,
    HEADLESS_SERVICE,
    CLUSTER_DOMAIN,
    MASTER_ADDR,
    MASTER_PORT,
    TRAINER_CMD,
    WAIT_TIMEOUT,
)
#: Every variable the launcher may export.
EXPORTED_VARS = (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, POD_PLAN) + (
    SOCKET_IFNAME_VARS
)

DEFAULT_CLUSTER_DOMAIN = "cluster.local"
DEFAULT_MASTER_PORT = 29500
DEFAULT_WAIT_TIMEOUT_S = 300.0

#: The parts of torchvision's GeneralizedRCNN, in forward order. A stage is a contiguous run of
#: them; post-processing belongs to `roi_heads`' stage.
MODULES = ("transform", "backbone", "rpn", "roi_heads")

PLAN_VERSION = 1


# ---------------------------------------------------------------------------------------------
# The pod plan record.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagePlacement:
    """Where one pipeline stage runs: on which worker, which modules, one device per replica."""

    stage: int  # 1-based position in the pipeline
    name: str  # the topology's name for it, e.g. "stage1"
    worker_index: int
    rank: int
    rpc_name: str
    modules: tuple[str, ...]
    devices: tuple[str, ...]  # replica r runs on devices[r]: "cuda:r" or "cpu"

    @property
    def replicas(self) -> int:
        return len(self.devices)


@dataclass(frozen=True)
class LinkEstimate:
    """Estimated traffic of one directed link per optimizer step (a formula, not a measurement)."""

    src: str  # rpc name of the sender
    dst: str  # rpc name of the receiver ("ring" for ddp's all-reduce)
    carries: str  # what travels, e.g. "features + targets"
    phase: str  # "forward" or "backward"
    messages_per_step: int
    bytes_per_step: int


@dataclass(frozen=True)
class PodPlan:
    """Everything one pod's trainer needs to join the job. `to_json`/`from_json` round-trip it."""

    engine: str  # "pipeline" or "ddp"
    role: str  # "master" or "worker"
    index: int  # 0 for the master; the worker's 0-based ordinal
    rank: int  # pipeline: this process's rank; ddp: the first global rank of this node
    world_size: int  # processes in the job
    rpc_name: str  # "master" or "worker<index+1>"
    master_addr: str
    master_port: int
    backend: str  # process-group backend: "nccl" when this pod has GPUs, else "gloo"
    devices: int  # GPUs this pod has (0: CPU only)
    nnodes: int  # pods in the job
    node_rank: int  # pipeline: == rank; ddp: master 0, worker i -> i + 1
    nproc_per_node: int  # pipeline: 1; ddp: devices, or 1 on CPU
    stages: tuple[StagePlacement, ...]  # global placement, in pipeline order (ddp: empty)
    stage: int | None  # this pod's stage (1-based), None for the master and for ddp
    modules: tuple[str, ...]  # this pod's modules, in order
    replicas: tuple[str, ...]  # this pod's replica devices, e.g. ("cuda:0", "cuda:1") or ("cpu",)
    transport: str  # "cpu" (tensors staged through host memory) or "device_maps"
    # TensorPipe device maps this pod sets as CALLER: {callee rpc name: {local device: remote device}}.
    # Responses come back through the inverse map. Empty on CPU and with transport "cpu".
    device_maps: dict[str, dict[str, str]]
    socket_ifname: str | None  # exported as TP_/GLOO_/NCCL_SOCKET_IFNAME when set
    feature_dtype: str  # dtype of features on the wire: "float32" or "bfloat16"
    micro_batches: int
    links: tuple[LinkEstimate, ...]  # every link of the job, estimated bytes per step
    dns_name: str | None = None  # this pod's stable DNS name when known (Kubernetes)
    pod_ip: str | None = None
    version: int = field(default=PLAN_VERSION)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PodPlan:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlanFormatError(f"{POD_PLAN}: unknown fields {unknown} (launcher and trainer versions differ?)")
        if data.get("version", PLAN_VERSION) != PLAN_VERSION:
            raise PlanFormatError(f"{POD_PLAN}: version {data.get('version')!r}, expected {PLAN_VERSION}")
        values = dict(data)
        try:
            values["stages"] = tuple(
                StagePlacement(**{**s, "modules": tuple(s["modules"]), "devices": tuple(s["devices"])})
                for s in data["stages"]
            )
            values["links"] = tuple(LinkEstimate(**link) for link in data["links"])
            values["modules"] = tuple(data["modules"])
            values["replicas"] = tuple(data["replicas"])
            values["device_maps"] = {k: dict(v) for k, v in data["device_maps"].items()}
            return cls(**values)
        except (KeyError, TypeError) as exc:
            raise PlanFormatError(f"{POD_PLAN}: malformed plan record: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> PodPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanFormatError(f"{POD_PLAN}: not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise PlanFormatError(f"{POD_PLAN}: expected a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PodPlan:
        env = os.environ if env is None else env
        text = env.get(POD_PLAN)
        if not text:
            raise PlanFormatError(f"{POD_PLAN} is not set: start the trainer through `maskrcnn-launch launch`")
        return cls.from_json(text)


def exported_env(plan: PodPlan) -> dict[str, str]:
    """The variables `launch` adds to the trainer's environment for this pod's plan."""
    env = {
        MASTER_ADDR: plan.master_addr,
        MASTER_PORT: str(plan.master_port),
        POD_PLAN: plan.to_json(),
    }
    if plan.engine == "pipeline":
        # For ddp, torch.distributed.run sets these per process; exporting node-level values would
        # only mislead anyone reading the pod's environment.
        env.update({RANK: str(plan.rank), WORLD_SIZE: str(plan.world_size), LOCAL_RANK: "0", LOCAL_WORLD_SIZE: "1"})
    if plan.socket_ifname:
        env.update({name: plan.socket_ifname for name in SOCKET_IFNAME_VARS})
    return env
