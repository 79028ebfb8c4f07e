"""The contract between pod spec, launcher, trainer and status reader: the one file that owns it.

Like Kubeflow's `envvar.go`: every variable the launcher reads or exports is named here once, and
the record it hands the trainer (`PodPlan`, serialised into `MASKRCNN_POD_PLAN`) is defined here.
The Helm chart's test compares the rendered pod specs against `POD_ENV_VARS`; the trainer does

    from maskrcnn_launcher.contract import PodPlan
    plan = PodPlan.from_env()

Besides the variables and the record, every decision two sides must take the same way lives here,
once: the StatefulSet pod name (`pod_name`, `parse_pod_name`: the launcher derives ranks from it,
`status` reads pods back with it), the JobSet pod's host name and labels (`jobset_host_name`,
`parse_jobset_host_name`, `jobset_role`: the chart's JobSet layout, read by the launcher and by
`status`), the module order and placement rule (`MODULES`,
`placement_problems`, `validate_placement`: the topology check and the trainer's stage split), the
process-group backend (`process_group_backend`) and the trainer's console progress line
(`format_progress_line`, `parse_progress_line`: the trainer writes it, `status` reads it back).

The exit codes and the error boundary every entry point runs in (boundary.py) are re-exported here:
Kubernetes acts on a pod's exit code (a JobSet fails at once on a user error), so the trainer's
processes must exit the way the launcher's do. So is the reader of the YAML files a user writes
(yamlfile.py: a key given twice is an error), so a topology and a trainer `--config` are read alike.

Only the standard library (and click for the boundary, PyYAML for the YAML reader) is imported: the
trainer imports this module next to torch, the launcher without it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from maskrcnn_launcher.boundary import DEBUG_ENV as DEBUG_ENV
from maskrcnn_launcher.boundary import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from maskrcnn_launcher.boundary import EXIT_RUNTIME as EXIT_RUNTIME
from maskrcnn_launcher.boundary import EXIT_USER_ERROR as EXIT_USER_ERROR
from maskrcnn_launcher.boundary import Failure as Failure
from maskrcnn_launcher.boundary import GuardedGroup as GuardedGroup
from maskrcnn_launcher.boundary import one_line as one_line
from maskrcnn_launcher.boundary import os_error_line as os_error_line
from maskrcnn_launcher.errors import PlanFormatError
from maskrcnn_launcher.yamlfile import load_yaml as load_yaml

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

# JobSet pods: the JobSet controller's labels and the Job controller's annotation, through the
# downward API. They name the replicated job and the index directly; the host name
# `<jobset>-<replicated job>-<job index>-<completion index>` is the fallback.
#: The JobSet's name (label jobset.sigs.k8s.io/jobset-name): the first part of every host name.
JOBSET_NAME = "MASKRCNN_JOBSET_NAME"
#: The pod's replicated job (label jobset.sigs.k8s.io/replicatedjob-name): `master` or `workers`.
REPLICATED_JOB = "MASKRCNN_REPLICATED_JOB"
#: The index of the pod's Job in its replicated job (label jobset.sigs.k8s.io/job-index).
JOB_INDEX = "MASKRCNN_JOB_INDEX"
#: The pod's completion index in its Indexed Job (annotation batch.kubernetes.io/job-completion-index).
COMPLETION_INDEX = "MASKRCNN_COMPLETION_INDEX"

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
#: Labels and annotations (same keys) the JobSet and Job controllers put on a JobSet's pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: What a JobSet pod spec sets besides POD_ENV_VARS: variable -> the downward-API field it comes from.
JOBSET_FIELDS = {
    JOBSET_NAME: f"metadata.labels['{JOBSET_NAME_LABEL}']",
    REPLICATED_JOB: f"metadata.labels['{REPLICATED_JOB_LABEL}']",
    JOB_INDEX: f"metadata.labels['{JOB_INDEX_LABEL}']",
    COMPLETION_INDEX: f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']",
}
JOBSET_POD_ENV_VARS = tuple(JOBSET_FIELDS)
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
    *JOBSET_POD_ENV_VARS,
    MASTER_ADDR,
    MASTER_PORT,
    TRAINER_CMD,
    WAIT_TIMEOUT,
)
#: The only MASKRCNN_* variables a user sets in a pod spec (the chart's extraEnv): the contract's two
#: and the error boundary's MASKRCNN_DEBUG (tracebacks, in every process). The chart refuses every
#: other variable of the contract, which the pod's identity or the launcher own.
USER_ENV_VARS = (TRAINER_CMD, WAIT_TIMEOUT, DEBUG_ENV)
#: Every variable the launcher may export.
EXPORTED_VARS = (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, POD_PLAN) + (
    SOCKET_IFNAME_VARS
)

DEFAULT_CLUSTER_DOMAIN = "cluster.local"
DEFAULT_MASTER_PORT = 29500
DEFAULT_WAIT_TIMEOUT_S = 300.0

#: Version of the `MASKRCNN_POD_PLAN` record; a launcher and a trainer that disagree fail at start-up
#: with a clear message instead of misreading each other. 2: the launcher-only fields left the record.
PLAN_VERSION = 2


# ---------------------------------------------------------------------------------------------
# Pod names: the launcher derives a pod's rank from its name, `status` reads pods back with it.
# ---------------------------------------------------------------------------------------------

ROLES = ("master", "worker")

# DNS-1123 label prefix, then the StatefulSet suffix. The prefix match is greedy, so a release
# called `a-worker-1` still parses as `a-worker-1-worker-<i>`.
_POD_NAME = re.compile(r"^(?P<prefix>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)-(?P<role>master|worker)-(?P<ordinal>[0-9]+)$")


def pod_name(prefix: str, role: str, index: int) -> str:
    """The StatefulSet pod name `<prefix>-<role>-<index>` (the chart's StatefulSets are `<prefix>-<role>`)."""
    return f"{prefix}-{role}-{index}"


def node_rank(role: str, index: int) -> int:
    """A pod's position in the job: the master 0, worker ordinal i -> i + 1. It is the pipeline rank
    and torchrun's --node-rank, and what `status` shows as a pod's rank."""
    return 0 if role == "master" else index + 1


def parse_pod_name(name: str) -> tuple[str, str, int] | None:
    """(prefix, role, ordinal) of a StatefulSet pod name, or None when it is not one of ours."""
    match = _POD_NAME.match(name)
    if not match:
        return None
    return match["prefix"], match["role"], int(match["ordinal"])


# The chart's JobSet (helm/templates/jobset.yaml): replicated job `master` of one pod, replicated job
# `workers` of one Indexed Job with a pod per worker, so worker i is completion index i of Job 0. One
# Job per role keeps the master's host name `<jobset>-master-0-0` whatever the worker count, and makes
# the index the Job's own completion index. The replicated job `workers` (plural) cannot be confused
# with a StatefulSet's `-worker-<i>`.
REPLICATED_JOBS = {"master": "master", "worker": "workers"}
_ROLE_OF_REPLICATED_JOB = {rjob: role for role, rjob in REPLICATED_JOBS.items()}
WORKLOADS = ("statefulset", "jobset")
_JOBSET_HOST = re.compile(
    r"^(?P<jobset>[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)-(?P<rjob>master|workers)-(?P<job>[0-9]+)-(?P<index>[0-9]+)$"
)


def jobset_host_name(jobset: str, role: str, index: int) -> str:
    """A JobSet pod's host name `<jobset>-<replicated job>-<job index>-<completion index>` for `role`
    and index `index` (Job 0, completion index `index`)."""
    return f"{jobset}-{REPLICATED_JOBS[role]}-0-{index}"


def jobset_role(replicated_job: str, job_index: int, completion_index: int) -> tuple[str, int]:
    """(role, index) of a JobSet pod from its replicated job, Job index and completion index;
    ValueError naming what does not fit the chart's layout."""
    role = _ROLE_OF_REPLICATED_JOB.get(replicated_job)
    if role is None:
        known = ", ".join(_ROLE_OF_REPLICATED_JOB)
        raise ValueError(f"replicated job {replicated_job!r} is not one of {known}")
    if job_index != 0:
        raise ValueError(
            f"replicated job {replicated_job!r}, Job index {job_index}: one Job per replicated job (replicas 1) is "
            "expected, its pods numbered by completion index"
        )
    return role, completion_index


def parse_jobset_host_name(name: str) -> tuple[str, str, int] | None:
    """(jobset, role, index) of a JobSet pod's host name, or None when it is not one of the chart's
    layout (a name that parses but has a Job index other than 0 is not)."""
    match = _JOBSET_HOST.match(name)
    if not match:
        return None
    try:
        role, index = jobset_role(match["rjob"], int(match["job"]), int(match["index"]))
    except ValueError:
        return None
    return match["jobset"], role, index


def host_name(workload: str, prefix: str, role: str, index: int) -> str:
    """The pod's host name (the first label of its DNS name) under a workload: the StatefulSet pod
    name, or the JobSet host name (`prefix` is then the JobSet's name)."""
    return jobset_host_name(prefix, role, index) if workload == "jobset" else pod_name(prefix, role, index)


# ---------------------------------------------------------------------------------------------
# Module placement: the topology check and the trainer's stage split apply the same rule.
# ---------------------------------------------------------------------------------------------

#: The parts of torchvision's GeneralizedRCNN, in forward order. A stage is a contiguous run of
#: them; post-processing belongs to `roi_heads`' stage.
MODULES = ("transform", "backbone", "rpn", "roi_heads")
#: Modules without parameters (resize and normalise): never a stage on their own.
PARAMETERLESS_MODULES = ("transform",)

_PLACEMENT_RULE = f"a placement splits {', '.join(MODULES)} into non-empty contiguous runs, in this order"


def placement_problems(placement: Sequence[Sequence[str]], trained: bool = True) -> list[str]:
    """Every reason `placement` (module names per stage, in pipeline order) is not a split of `MODULES`
    into non-empty contiguous runs in forward order; empty when it is one.

    The stages hand each other GeneralizedRCNN.forward's local variables in its own order, so a stage
    can only be a contiguous run and the runs can only come in forward order. Stages are numbered from
    1 in the messages; unknown names are reported once each, and left out of the order check so one
    typo does not also read as "missing" and "out of order". `trained`: the stages train (each holds an
    optimizer), so none may be only parameterless modules; a profiler timing each module alone does not.
    """
    if not placement:
        return ["no stages: the placement needs at least one"]
    problems = []
    stages: list[tuple[str, ...]] = []
    for i, names in enumerate(placement, start=1):
        if isinstance(names, str):  # ["transform", ...] instead of [["transform", ...]]
            problems.append(f"stage {i} is the string {names!r}, not a list of module names")
            names = ()
        elif not names:
            problems.append(f"stage {i} is empty")
        stages.append(tuple(names))
    flat = [name for names in stages for name in names]
    unknown = list(dict.fromkeys(name for name in flat if name not in MODULES))
    problems += [f"unknown module {name!r} (the modules are {', '.join(MODULES)})" for name in unknown]
    placed = [name for name in flat if name in MODULES]
    counts_ok = True
    for module in MODULES:
        holders = [i for i, names in enumerate(stages, start=1) if module in names]
        if not holders:
            problems.append(f"module {module!r} is placed in no stage")
            counts_ok = False
        elif len(holders) > 1:
            problems.append(f"module {module!r} is placed in {len(holders)} stages")
            counts_ok = False
        elif placed.count(module) > 1:
            problems.append(f"module {module!r} is listed {placed.count(module)} times in stage {holders[0]}")
            counts_ok = False
    # A stage trains its parameters (each holds an optimizer); `transform` alone has none to train.
    for i, names in enumerate(stages, start=1):
        if trained and names and all(name in PARAMETERLESS_MODULES for name in names):
            problems.append(
                f"stage {i} holds only {', '.join(names)}, which has no parameters to train: "
                "put it in one stage with the module after it"
            )
    # Each module placed once: the stages are contiguous runs in forward order iff the concatenation
    # is the forward order itself (a gap in one stage or a swapped pair both break it).
    if counts_ok and tuple(placed) != MODULES:
        problems.append(
            f"modules out of order: {', '.join(placed)}; stages must be contiguous runs of the forward order "
            f"{', '.join(MODULES)}"
        )
    return problems


def validate_placement(placement: Sequence[Sequence[str]], trained: bool = True) -> tuple[tuple[str, ...], ...]:
    """The placement as tuples, or ValueError naming every problem (joined by "; ") and the rule."""
    problems = placement_problems(placement, trained)
    if problems:
        shown = [[names] if isinstance(names, str) else list(names) for names in placement]
        raise ValueError(f"placement {shown}: {'; '.join(problems)} ({_PLACEMENT_RULE})")
    return tuple(tuple(names) for names in placement)


# ---------------------------------------------------------------------------------------------
# Process-group backend: the plan records it, the trainer's ddp engine uses it.
# ---------------------------------------------------------------------------------------------


def process_group_backend(uses_gpu: bool, shares_gpu: bool = False) -> str:
    """nccl for processes that hold GPUs (it moves CUDA tensors without host copies), gloo otherwise
    (nccl cannot run without a GPU). `shares_gpu`: several ranks of this machine run on one GPU (more
    ranks than GPUs, e.g. a 2-process check on a one-GPU machine); nccl refuses two ranks on the same
    device, gloo all-reduces their CUDA tensors through host memory. The launcher records the backend
    in the plan, the ddp engine calls this too, so both always agree."""
    return "nccl" if uses_gpu and not shares_gpu else "gloo"


# ---------------------------------------------------------------------------------------------
# Pipeline edges: which stage outputs may cross between workers as device tensors.
# ---------------------------------------------------------------------------------------------


def edge_device_map(transport: str, sender: Sequence[str], receiver: Sequence[str]) -> dict[str, str]:
    """TensorPipe map of the edge from the stage on devices `sender` to the next stage on `receiver`:
    {receiver device: sender device} (the receiver calls `to_here()` on the sender's output, so it is
    the caller whose options hold the map). Replica r maps to replica r ("identity by replica
    index": one-to-one and its own inverse). Empty, i.e. tensors must be staged through host memory,
    unless `transport` is "device_maps" and both ends are all CUDA devices. The launcher builds the
    workers' RPC options from it; a stage host sends a replica's output as device tensors only when
    that replica's device is a value here, so a GPU stage before a CPU stage never sends CUDA
    tensors that no map covers."""
    if transport != "device_maps" or not sender or not receiver:
        return {}
    if not all(d.startswith("cuda:") for d in (*sender, *receiver)):
        return {}
    return {receiver[r]: sender[r] for r in range(min(len(sender), len(receiver)))}


# ---------------------------------------------------------------------------------------------
# The trainer's console progress line: the trainer writes it, `status` reads it from the pod's log.
# ---------------------------------------------------------------------------------------------

# Plain `<kind> step <step>/<total> <name> <value> ...`, or the terminal bar `[###...] <step>/<total> ...`
# (a bar is always a train step). Searched, not anchored: log collectors may prefix the line.
PROGRESS_KINDS = ("train", "val", "eval")
PROGRESS_BAR_WIDTH = 30
_PROGRESS_LINE = re.compile(
    rf"(?:\b(?P<kind>{'|'.join(PROGRESS_KINDS)}) step |\[[#.]+\] )(?P<step>\d+)/(?P<total>\d+)(?P<rest>.*)"
)


def progress_values(values: Mapping[str, Any]) -> str:
    """`name value` pairs of the float values shown on the console, each value `.4g`.

    Names with a "/" are engine extras ("link/...", "stage1/..."): they go to the metrics file and
    TensorBoard, not the console. Ints (epoch) and lists are left out too."""
    return " ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, float) and "/" not in k)


def format_progress_line(kind: str, step: int, total: int, values: Mapping[str, Any]) -> str:
    """One plain progress line (no newline), what pods and CI logs show: `train step 20/150 loss 1.2 ...`."""
    shown = progress_values(values)
    return f"{kind} step {step}/{total}" + (f" {shown}" if shown else "")


def format_progress_bar(step: int, total: int, values: Mapping[str, Any], width: int = PROGRESS_BAR_WIDTH) -> str:
    """The terminal's one-line train progress bar (no carriage return): `[#####.....] 20/150 loss 1.2 ...`."""
    done = int(width * step / max(1, total))
    shown = progress_values(values)
    return f"[{'#' * done}{'.' * (width - done)}] {step}/{total}" + (f" {shown}" if shown else "")


def parse_progress_line(line: str) -> dict[str, Any] | None:
    """Read back one console line of the trainer: {"kind", "step", "total", <name>: float, ...}.

    None when the line is not one (log lines of other modules, tracebacks). Values printed with
    `.4g` ("1e-05", "nan", "inf") read back as floats; a token that is not a number is skipped
    rather than failing the line, so a `kubectl logs` tail with a torn line still parses.
    """
    match = _PROGRESS_LINE.search(line)
    if match is None:
        return None
    parsed: dict[str, Any] = {
        "kind": match["kind"] or "train",
        "step": int(match["step"]),
        "total": int(match["total"]),
    }
    tokens = match["rest"].split()
    for name, value in zip(tokens[::2], tokens[1::2]):
        try:
            parsed[name] = float(value)
        except ValueError:
            continue
    return parsed


# ---------------------------------------------------------------------------------------------
# The pod plan record: only what a pod's trainer processes read.
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
class PodPlan:
    """What one pod's trainer processes need to join the job, and nothing else: the launcher-only
    facts (GPU count, torchrun's node layout, DNS name, socket interface, byte estimates) stay in the
    launcher's `plan.PodLaunch`, so the trainer cannot come to depend on them. `to_json`/`from_json`
    round-trip it."""

    engine: str  # "pipeline" or "ddp"
    role: str  # "master" or "worker"
    index: int  # 0 for the master; the worker's 0-based ordinal
    rank: int  # pipeline: this process's rank; ddp: the first global rank of this node
    world_size: int  # processes in the job
    rpc_name: str  # "master" or "worker<index+1>"
    master_addr: str
    master_port: int
    backend: str  # process-group backend, `process_group_backend(pod has GPUs)`: "nccl" or "gloo"
    stages: tuple[StagePlacement, ...]  # global placement, in pipeline order (ddp: empty)
    transport: str  # "cpu" (tensors staged through host memory) or "device_maps"
    # TensorPipe device maps this pod sets as CALLER: {callee rpc name: {local device: remote device}}.
    # Responses come back through the inverse map. Empty on CPU and with transport "cpu".
    device_maps: dict[str, dict[str, str]]
    version: int = field(default=PLAN_VERSION)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PodPlan:
        if data.get("version", PLAN_VERSION) != PLAN_VERSION:
            raise PlanFormatError(
                f"{POD_PLAN}: version {data.get('version')!r}, expected {PLAN_VERSION} "
                "(launcher and trainer versions differ?)"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PlanFormatError(f"{POD_PLAN}: unknown fields {unknown} (launcher and trainer versions differ?)")
        values = dict(data)
        try:
            values["stages"] = tuple(
                StagePlacement(**{**s, "modules": tuple(s["modules"]), "devices": tuple(s["devices"])})
                for s in data["stages"]
            )
            values["device_maps"] = {k: dict(v) for k, v in data["device_maps"].items()}
            return cls(**values)
        except (KeyError, TypeError, AttributeError) as exc:
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
            raise PlanFormatError(
                f"--engine pipeline runs under the launcher, but {POD_PLAN} is not set: start it with "
                "`maskrcnn-launch launch -- ARGS` on each machine, or `maskrcnn-launch local -- ARGS` on one"
            )
        return cls.from_json(text)


def exported_env(plan: PodPlan, socket_ifname: str | None = None) -> dict[str, str]:
    """The variables `launch` adds to the trainer's environment: MASTER_ADDR/PORT and the plan; for
    the pipeline also RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; the socket interface variables
    when the topology names an interface (`socket_ifname`)."""
    env = {
        MASTER_ADDR: plan.master_addr,
        MASTER_PORT: str(plan.master_port),
        POD_PLAN: plan.to_json(),
    }
    if plan.engine == "pipeline":
        # For ddp, torch.distributed.run sets these per process; exporting node-level values would
        # only mislead anyone reading the pod's environment.
        env.update({RANK: str(plan.rank), WORLD_SIZE: str(plan.world_size), LOCAL_RANK: "0", LOCAL_WORLD_SIZE: "1"})
    if socket_ifname:
        env.update({name: socket_ifname for name in SOCKET_IFNAME_VARS})
    return env
