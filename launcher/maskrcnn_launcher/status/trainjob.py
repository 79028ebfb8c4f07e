"""`status --trainjob`: a Kubeflow Trainer v2 TrainJob's state, the progress and AP its trainer posted into
`status.trainerStatus`, and its pods; pure functions over the API's JSON (tested without an API server).

`status.trainerStatus` is the TrainJob CRD's (kubeflow/trainer v2.3.0, schemas/): progressPercentage,
estimatedRemainingSeconds, metrics (name/value strings) and lastUpdatedTime, the fields the kit's trainer
posts (src/maskrcnn_dist/progress_post.py: loss, lr, images_per_s, bbox_AP, segm_AP). The state comes from
the TrainJob's conditions (Trainer's JobSet plugin sets Complete and Failed from the JobSet's; Suspended
while a queue holds it). A pod's rank is its Job completion index (PET_NODE_RANK).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from maskrcnn_launcher.boundary import one_line
from maskrcnn_launcher.status.report import Obj, PodStatus, pod_table, read_pods, running_count

TRAINER_GROUP, TRAINER_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
TERMINAL = ("Complete", "Failed")


@dataclass(frozen=True)
class TrainerStatus:
    """`status.trainerStatus` as posted: None where the trainer did not say."""

    progress_percentage: int | None
    estimated_remaining_seconds: int | None
    metrics: dict[str, str]
    last_updated_time: str | None


@dataclass(frozen=True)
class TrainJobStatus:
    name: str
    namespace: str
    state: str  # Running | Suspended | Complete | Failed
    reason: str | None
    message: str | None
    runtime: str  # kind/name of the runtime it references
    num_nodes: int | None
    trainer: TrainerStatus | None
    pods: list[PodStatus] = field(default_factory=list)


def read_trainjob(obj: Obj, pods: Sequence[Obj]) -> TrainJobStatus:
    """A TrainJob object and its pods (those of its JobSet) as a status record."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    terminal = next((c for c in conditions if c.get("type") in TERMINAL), None)
    if terminal is not None:
        state = terminal["type"]
    elif spec.get("suspend") or any(c.get("type") == "Suspended" for c in conditions):
        state = "Suspended"
    else:
        state = "Running"
    ref = spec.get("runtimeRef") or {}
    return TrainJobStatus(
        name=obj["metadata"]["name"],
        namespace=obj["metadata"].get("namespace", ""),
        state=state,
        reason=terminal.get("reason") if terminal else None,
        message=terminal.get("message") if terminal else None,
        runtime=f"{ref.get('kind', 'ClusterTrainingRuntime')}/{ref.get('name', '?')}",
        num_nodes=(spec.get("trainer") or {}).get("numNodes"),
        trainer=_trainer_status(status.get("trainerStatus")),
        pods=read_pods(pods)[0],
    )


def _trainer_status(raw: Obj | None) -> TrainerStatus | None:
    if not raw:
        return None
    return TrainerStatus(
        progress_percentage=raw.get("progressPercentage"),
        estimated_remaining_seconds=raw.get("estimatedRemainingSeconds"),
        metrics={m["name"]: m["value"] for m in raw.get("metrics") or [] if "name" in m and "value" in m},
        last_updated_time=raw.get("lastUpdatedTime"),
    )


def render_trainjob(status: TrainJobStatus, *, as_json: bool = False) -> str:
    """A table for people, or JSON (the dataclasses as dicts) for scripts."""
    if as_json:
        return json.dumps(dataclasses.asdict(status), indent=2)
    head = f"trainjob {status.name} in namespace {status.namespace}: {status.state}"
    if status.reason:
        head += f" ({status.reason}: {one_line(status.message)})" if status.message else f" ({status.reason})"
    nodes = f"{status.num_nodes} node(s), " if status.num_nodes is not None else ""
    head += f", runtime {status.runtime}, {nodes}{len(status.pods)} pods, {running_count(status.pods)} running"
    lines = [head, *pod_table(status.pods), *_trainer_lines(status.trainer)]
    return "\n".join(lines)


def _trainer_lines(trainer: TrainerStatus | None) -> list[str]:
    if trainer is None:
        return [
            "progress: none in status.trainerStatus (not posted yet, or Kubeflow Trainer's TrainJobStatus "
            "feature gate is off)"
        ]
    parts = []
    if trainer.progress_percentage is not None:
        parts.append(f"{trainer.progress_percentage}%")
    if trainer.estimated_remaining_seconds is not None:
        parts.append(f"ETA {_duration(trainer.estimated_remaining_seconds)}")
    if trainer.last_updated_time:
        parts.append(f"updated {trainer.last_updated_time}")
    lines = [f"progress: {'  '.join(parts) or 'none'}"]
    if trainer.metrics:
        lines.append("metrics: " + "  ".join(f"{name} {value}" for name, value in trainer.metrics.items()))
    return lines


def _duration(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
