"""Host names: the StatefulSet pod name, the JobSet pod's host name and a TrainJob node's, and their parsers.

The launcher derives a pod's role, index and rank from them, the plan prints the pods' DNS names with
them, and `status` reads pods back with them: one format, written and read here.
"""

from __future__ import annotations

import re

__all__ = [
    "REPLICATED_JOBS",
    "ROLES",
    "TRAINJOB_REPLICATED_JOB",
    "WORKLOADS",
    "host_name",
    "jobset_host_name",
    "jobset_role",
    "node_rank",
    "parse_jobset_host_name",
    "parse_pod_name",
    "parse_trainjob_master_addr",
    "pod_name",
    "trainjob_host_name",
    "trainjob_master_addr",
    "trainjob_role",
]

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
WORKLOADS = ("statefulset", "jobset", "trainjob")
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


# A Kubeflow Trainer v2 TrainJob (its torch runtime): the JobSet is named after the TrainJob, with one
# replicated job `node` of one Indexed Job whose completion index is the node rank (PET_NODE_RANK), and
# the TrainJob's name as the subdomain: node 0 is `<trainjob>-node-0-0.<trainjob>`, PET_MASTER_ADDR
# (kubeflow/trainer v2.3.0 pkg/runtime/framework/plugins/torch/torch.go, pkg/constants: Node = "node").
TRAINJOB_REPLICATED_JOB = "node"
_TRAINJOB_MASTER_ADDR = re.compile(r"^(?P<job>[a-z]([-a-z0-9]*[a-z0-9])?)-node-0-0\.(?P=job)$")


def trainjob_role(node: int) -> tuple[str, int]:
    """(role, index) of a TrainJob's node `node`: node 0 is the master, node i is worker i - 1."""
    return ("master", 0) if node == 0 else ("worker", node - 1)


def trainjob_host_name(trainjob: str, role: str, index: int) -> str:
    """A TrainJob node's host name `<trainjob>-node-0-<node rank>`."""
    return f"{trainjob}-{TRAINJOB_REPLICATED_JOB}-0-{node_rank(role, index)}"


def trainjob_master_addr(trainjob: str) -> str:
    """PET_MASTER_ADDR of a TrainJob: node 0's host name under the TrainJob's subdomain."""
    return f"{trainjob_host_name(trainjob, 'master', 0)}.{trainjob}"


def parse_trainjob_master_addr(addr: str) -> str | None:
    """The TrainJob's name in a PET_MASTER_ADDR of the torch runtime's form, or None."""
    match = _TRAINJOB_MASTER_ADDR.match(addr)
    return match["job"] if match else None


def host_name(workload: str, prefix: str, role: str, index: int) -> str:
    """The pod's host name (the first label of its DNS name) under a workload: the StatefulSet pod
    name, the JobSet host name (`prefix` is then the JobSet's name) or a TrainJob node's (`prefix`: the
    TrainJob's name)."""
    if workload == "trainjob":
        return trainjob_host_name(prefix, role, index)
    return jobset_host_name(prefix, role, index) if workload == "jobset" else pod_name(prefix, role, index)
