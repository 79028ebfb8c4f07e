"""The pod plan record: what `launch` hands the trainer in `MASKRCNN_POD_PLAN`, and the environment it
exports beside it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from maskrcnn_launcher.contract.env import (
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    MASTER_ADDR,
    MASTER_PORT,
    POD_PLAN,
    RANK,
    SOCKET_IFNAME_VARS,
    WORLD_SIZE,
)
from maskrcnn_launcher.errors import PlanFormatError

__all__ = ["PLAN_VERSION", "PodPlan", "StagePlacement", "exported_env"]

#: Version of the `MASKRCNN_POD_PLAN` record; a launcher and a trainer that disagree fail at start-up
#: with a clear message instead of misreading each other. 2: the launcher-only fields left the record.
PLAN_VERSION = 2


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
    transport: str  # "cpu" (tensors staged through host memory) or "device_maps" (the topology's "auto", resolved)
    # TensorPipe device maps this pod sets as CALLER: {callee rpc name: {local device: remote device}}: a
    # pipeline stage's map for the next stage (activations) and for the one before (gradients). Empty on
    # CPU and with transport "cpu".
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
