"""The status report: what the Kubernetes API's answers say, as plain records, and the table or JSON a
user reads.

Pure functions over the API's JSON (objects as the API server sends them: camelCase keys, fields it
leaves out absent), so they are tested without an API server; `client.py` fetches that JSON. A pod's
role and rank come from the contract's rules, the same that give the pod its rank at start-up:
`contract.parse_pod_name` for a StatefulSet pod, the JobSet and Job controllers' labels and annotation
(`contract.jobset_role`, the host name as a fallback) for a JobSet's, ranked by `contract.node_rank`.
The master's progress is the last line `contract.parse_progress_line` reads in its log tail.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from maskrcnn_launcher import contract
from maskrcnn_launcher.boundary import one_line
from maskrcnn_launcher.contract import (
    TRAINJOB_REPLICATED_JOB,
    jobset_role,
    node_rank,
    parse_jobset_host_name,
    parse_membership_line,
    parse_pod_name,
    parse_progress_line,
    trainjob_role,
)

# Labels the chart puts on every training pod (helm/templates/_names.tpl, statefulsets.yaml).
INSTANCE_LABEL = "app.kubernetes.io/instance"
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF_VALUE = "maskrcnn-dist"
COMPONENT_LABEL = "app.kubernetes.io/component"
# The chart's training container; a pod with one container is read whatever its name.
TRAINER_CONTAINER = "trainer"

Obj = Mapping[str, Any]  # an API object as JSON


@dataclass(frozen=True)
class PodStatus:
    name: str
    role: str  # master | worker
    rank: int | None  # None when the name is not a StatefulSet pod name of ours
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    restarts: int  # summed over the pod's containers
    node: str | None  # None while unscheduled
    # Why a container is not running (CrashLoopBackOff, ImagePullBackOff, Error ...): the phase of a
    # crash-looping pod is still Running, so the phase alone hides the problem.
    reason: str | None = None
    restart_attempt: int | None = None  # a JobSet pod's group restart attempt (0 for the first run)


@dataclass(frozen=True)
class JobSetStatus:
    """A JobSet release's own state, as its controller reports it."""

    name: str
    state: str  # Running | Suspended | Completed | Failed
    reason: str | None  # the Completed / Failed condition's reason, e.g. ReachedMaxRestarts
    message: str | None
    restarts: int  # whole-group restarts so far (status.restarts)
    max_restarts: int | None  # spec.failurePolicy.maxRestarts


@dataclass(frozen=True)
class Progress:
    step: int
    total: int
    loss: float | None
    images_per_s: float | None
    line: str  # the log line it was read from
    world_size: int | None = None  # the ranks training now (an elastic ddp job's changes with its members)
    lost: int = 0  # an elastic ddp job's ranks lost, left and joined, in the log tail read
    left: int = 0
    joined: int = 0
    last_change: str | None = None  # the newest such change, e.g. "rank 2 joined after step 30"


@dataclass(frozen=True)
class ReleaseStatus:
    release: str
    namespace: str
    pods: list[PodStatus] = field(default_factory=list)
    progress: Progress | None = None
    # Why there is no progress (master not started yet, log not readable, no train line yet).
    progress_note: str | None = None
    jobset: JobSetStatus | None = None  # None for a StatefulSet release
    jobset_note: str | None = None  # why the JobSet could not be read, when it could not


# -- reading ----------------------------------------------------------------------------------------


def jobset_status(obj: Obj) -> JobSetStatus:
    """A JobSet's state: its terminal Completed / Failed condition (with its reason), Suspended while a
    queue (Kueue) holds it, else Running; its whole-group restarts against `failurePolicy.maxRestarts`."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    terminal = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") in ("Completed", "Failed") and c.get("status") == "True"
        ),
        None,
    )
    if terminal is not None:
        state = terminal["type"]
    else:
        state = "Suspended" if spec.get("suspend") else "Running"
    return JobSetStatus(
        name=obj["metadata"]["name"],
        state=state,
        reason=terminal.get("reason") if terminal else None,
        message=terminal.get("message") if terminal else None,
        restarts=int(status.get("restarts") or 0),
        max_restarts=(spec.get("failurePolicy") or {}).get("maxRestarts"),
    )


def pod_role(pod: Obj) -> tuple[str, int] | None:
    """(role, index) from a StatefulSet pod name, a JobSet pod's labels (a TrainJob's node: its completion
    index is the node rank), or its host name."""
    metadata = pod["metadata"]
    parsed = parse_pod_name(metadata["name"])
    if parsed is not None:
        return parsed[1], parsed[2]
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    replicated_job = labels.get(contract.REPLICATED_JOB_LABEL)
    completion = annotations.get(contract.COMPLETION_INDEX_ANNOTATION) or labels.get(
        contract.COMPLETION_INDEX_ANNOTATION
    )
    if replicated_job and completion is not None:
        try:
            if replicated_job == TRAINJOB_REPLICATED_JOB:
                return trainjob_role(int(completion))
            return jobset_role(replicated_job, int(labels.get(contract.JOB_INDEX_LABEL) or 0), int(completion))
        except ValueError:
            return None
    hostname = (pod.get("spec") or {}).get("hostname")
    parsed = parse_jobset_host_name(hostname) if hostname else None
    return (parsed[1], parsed[2]) if parsed else None


def pod_status(pod: Obj) -> PodStatus:
    metadata, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    labels = metadata.get("labels") or {}
    found = pod_role(pod)
    role = found[0] if found else labels.get(COMPONENT_LABEL, "?")
    rank = None if found is None else node_rank(*found)
    attempt = labels.get(contract.RESTART_ATTEMPT_LABEL)
    statuses = _container_statuses(pod)
    restarts = sum(s.get("restartCount") or 0 for s in statuses)
    reason = _state_reason(statuses, "waiting")
    if reason is None:
        reason = _state_reason(statuses, "terminated")
    phase = status.get("phase") or "Unknown"
    if metadata.get("deletionTimestamp") is not None:
        reason = "Terminating"
    return PodStatus(
        metadata["name"], role, rank, phase, restarts, spec.get("nodeName"), reason, int(attempt) if attempt else None
    )


def read_pods(items: Sequence[Obj]) -> tuple[list[PodStatus], Obj | None]:
    """The pods in rank order (then restart attempt, then name), and the master whose log tells the
    progress: for a JobSet the newest restart attempt's (an older one may still be terminating)."""
    pairs = [(pod_status(pod), pod) for pod in items]
    pairs.sort(key=lambda pair: (pair[0].rank is None, pair[0].rank or 0, pair[0].restart_attempt or 0, pair[0].name))
    masters = [(status.restart_attempt or 0, pod) for status, pod in pairs if status.role == "master"]
    master = max(masters, key=lambda pair: pair[0])[1] if masters else None
    return [status for status, _ in pairs], master


def not_started(pod: Obj) -> str | None:
    """Why `pod` has no log to read yet, or None when it has one. A container that ever ran has a log
    (a crash-looping one: its last run's); one still being created or pulled has none, and the API
    would answer 400."""
    started = any(
        s.get("restartCount") or _in_state(s, "running") or _in_state(s, "terminated") for s in _container_statuses(pod)
    )
    if started:
        return None
    return f"master pod {pod['metadata']['name']} has not started ({(pod.get('status') or {}).get('phase')})"


def log_container(pod: Obj) -> str:
    """The trainer's container, or the pod's only (first) container."""
    containers = [c["name"] for c in pod["spec"]["containers"]]
    return TRAINER_CONTAINER if TRAINER_CONTAINER in containers else containers[0]


def latest_progress(log: str, pod: str, log_lines: int) -> tuple[Progress | None, str | None]:
    """The last train line of a log tail of `log_lines` lines of `pod`, or why there is none; with an
    elastic ddp job's changes of membership in that tail counted, and the newest world size either says."""
    lines = log.splitlines()
    changes = [(i, change) for i, line in enumerate(lines) if (change := parse_membership_line(line))]
    for index in range(len(lines) - 1, -1, -1):
        parsed = parse_progress_line(lines[index])
        if parsed is not None and parsed["kind"] == "train":
            world = int(parsed["world"]) if "world" in parsed else None
            if changes and changes[-1][0] > index:  # a change after the last train line is newer
                world = changes[-1][1]["world_size"]
            counts = {event: sum(c["event"] == event for _, c in changes) for event in ("lost", "left", "joined")}
            newest = changes[-1][1] if changes else None
            last = f"rank {newest['rank']} {newest['event']} after step {newest['step']}" if newest else None
            return (
                Progress(
                    parsed["step"],
                    parsed["total"],
                    parsed.get("loss"),
                    parsed.get("images_per_s"),
                    lines[index].strip(),
                    world,
                    **counts,
                    last_change=last,
                ),
                None,
            )
    return None, f"no train step in the last {log_lines} log lines of {pod}"


def _container_statuses(pod: Obj) -> list[Obj]:
    return (pod.get("status") or {}).get("containerStatuses") or []


def _state_reason(statuses: Sequence[Obj], state: str) -> str | None:
    """The reason of the first container in `state` (waiting, terminated), None when there is none."""
    return next(((s.get("state") or {})[state].get("reason") for s in statuses if _in_state(s, state)), None)


def _in_state(container_status: Obj, state: str) -> bool:
    return (container_status.get("state") or {}).get(state) is not None


# -- rendering --------------------------------------------------------------------------------------


def render_status(status: ReleaseStatus, *, as_json: bool = False) -> str:
    """A table for people, or JSON (the dataclasses as dicts) for scripts."""
    if as_json:
        return json.dumps(dataclasses.asdict(status), indent=2)
    running = running_count(status.pods)
    lines = [f"release {status.release} in namespace {status.namespace}: {len(status.pods)} pods, {running} running"]
    if status.jobset is not None:
        lines.append(_jobset_text(status.jobset))
    elif status.jobset_note:
        lines.append(f"jobset: not readable ({status.jobset_note})")
    lines += pod_table(status.pods)
    lines.append(f"progress: {_progress_text(status)}")
    return "\n".join(lines)


def running_count(pods: Sequence[PodStatus]) -> int:
    return sum(pod.phase == "Running" and pod.reason is None for pod in pods)


def pod_table(pods: Sequence[PodStatus]) -> list[str]:
    """One line per pod: name, role, rank, phase (and why a container is not running), restarts, node."""
    header = ("POD", "ROLE", "RANK", "PHASE", "RESTARTS", "NODE")
    rows = [
        (
            pod.name,
            pod.role,
            "-" if pod.rank is None else str(pod.rank),
            pod.phase if pod.reason is None else f"{pod.phase} ({pod.reason})",
            str(pod.restarts),
            pod.node or "-",
        )
        for pod in pods
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]


def _jobset_text(jobset: JobSetStatus) -> str:
    """`jobset NAME: Failed (ReachedMaxRestarts: ...), restarts 3 of 3`."""
    state = jobset.state
    if jobset.reason:
        state += f" ({jobset.reason}: {one_line(jobset.message)})" if jobset.message else f" ({jobset.reason})"
    limit = f" of {jobset.max_restarts}" if jobset.max_restarts is not None else ""
    return f"jobset {jobset.name}: {state}, restarts {jobset.restarts}{limit}"


def _progress_text(status: ReleaseStatus) -> str:
    progress = status.progress
    if progress is None:
        return f"none ({status.progress_note})" if status.progress_note else "none"
    parts = [f"step {progress.step}/{progress.total} ({100 * progress.step / max(1, progress.total):.0f}%)"]
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4g}")
    if progress.images_per_s is not None:
        parts.append(f"images/s {progress.images_per_s:.3g}")
    if progress.world_size is not None:
        parts.append(f"world size {progress.world_size}")
    if progress.lost or progress.left or progress.joined:
        counts = f"{progress.lost} lost, {progress.left} left, {progress.joined} joined"
        parts.append(f"members: {counts} (newest: {progress.last_change})")
    return "  ".join(parts)
