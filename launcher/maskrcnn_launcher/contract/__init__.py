"""The contract between pod spec, launcher, trainer and status reader: the one package that owns it.

Like Kubeflow's `envvar.go`: every variable the launcher reads or exports is named once (`env.py`), and
the record it hands the trainer (`PodPlan`, serialised into `MASKRCNN_POD_PLAN`) is defined once
(`pod_plan.py`). The Helm chart's test compares the rendered pod specs against `POD_ENV_VARS`; the
trainer does

    from maskrcnn_launcher.contract import PodPlan
    plan = PodPlan.from_env()

Besides the variables and the record, every decision two sides must take the same way lives here,
once, in a module of its own:
- `hosts.py`: the StatefulSet pod name (`pod_name`, `parse_pod_name`: the launcher derives ranks from
  it, `status` reads pods back with it) and the JobSet pod's host name (`jobset_host_name`,
  `parse_jobset_host_name`, `jobset_role`: the chart's JobSet layout, read by the launcher and by
  `status`);
- `placement.py`: the module order and placement rule (`MODULES`, `placement_problems`,
  `validate_placement`: the topology check and the trainer's stage split), the process-group backend
  (`process_group_backend`) and the pipeline edges' device maps (`edge_device_map`);
- `progress.py`: the trainer's console progress line (`format_progress_line`, `parse_progress_line`:
  the trainer writes it, `status` reads it back).
Every name is re-exported here: callers import from `maskrcnn_launcher.contract`, not from its modules.

The exit codes and the error boundary every entry point runs in (boundary.py) are re-exported here:
Kubernetes acts on a pod's exit code (a JobSet fails at once on a user error), so the trainer's
processes must exit the way the launcher's do. So is the reader of the YAML files a user writes
(yamlfile.py: a key given twice is an error), so a topology and a trainer `--config` are read alike.

Only the standard library (and click for the boundary, PyYAML for the YAML reader) is imported: the
trainer imports this package next to torch, the launcher without it.
"""

from __future__ import annotations

from maskrcnn_launcher.boundary import (
    DEBUG_ENV,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_STOPPED,
    EXIT_TERMINATED,
    EXIT_UNREACHABLE,
    EXIT_USER_ERROR,
    Failure,
    GuardedGroup,
    one_line,
    os_error_line,
)
from maskrcnn_launcher.contract.env import (
    CLUSTER_DOMAIN,
    COMPLETION_INDEX,
    COMPLETION_INDEX_ANNOTATION,
    DEFAULT_CLUSTER_DOMAIN,
    DEFAULT_MASTER_PORT,
    DEFAULT_WAIT_TIMEOUT_S,
    EXPORTED_VARS,
    GLOO_SOCKET_IFNAME,
    HEADLESS_SERVICE,
    HOSTNAME,
    INDEX,
    JOB_INDEX,
    JOB_INDEX_LABEL,
    JOBSET_FIELDS,
    JOBSET_NAME,
    JOBSET_NAME_LABEL,
    JOBSET_POD_ENV_VARS,
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    MASTER_ADDR,
    MASTER_PORT,
    NCCL_SOCKET_IFNAME,
    POD_ENV_VARS,
    POD_IP,
    POD_NAME,
    POD_NAMESPACE,
    POD_PLAN,
    RANK,
    READ_VARS,
    REPLICATED_JOB,
    REPLICATED_JOB_LABEL,
    RESTART_ATTEMPT_LABEL,
    ROLE,
    SOCKET_IFNAME_VARS,
    TERMINATION_GRACE_SECONDS,
    TOPOLOGY,
    TP_SOCKET_IFNAME,
    TRAINER_CMD,
    TRAINER_READ_VARS,
    USER_ENV_VARS,
    WAIT_TIMEOUT,
    WORLD_SIZE,
)
from maskrcnn_launcher.contract.hosts import (
    REPLICATED_JOBS,
    ROLES,
    WORKLOADS,
    host_name,
    jobset_host_name,
    jobset_role,
    node_rank,
    parse_jobset_host_name,
    parse_pod_name,
    pod_name,
)
from maskrcnn_launcher.contract.placement import (
    MODULES,
    PARAMETERLESS_MODULES,
    edge_device_map,
    placement_problems,
    process_group_backend,
    validate_placement,
)
from maskrcnn_launcher.contract.pod_plan import PLAN_VERSION, PodPlan, StagePlacement, exported_env
from maskrcnn_launcher.contract.progress import (
    PROGRESS_BAR_WIDTH,
    PROGRESS_KINDS,
    format_progress_bar,
    format_progress_line,
    parse_progress_line,
    progress_values,
)
from maskrcnn_launcher.errors import PlanFormatError
from maskrcnn_launcher.yamlfile import load_yaml

__all__ = [
    "CLUSTER_DOMAIN",
    "COMPLETION_INDEX",
    "COMPLETION_INDEX_ANNOTATION",
    "DEBUG_ENV",
    "DEFAULT_CLUSTER_DOMAIN",
    "DEFAULT_MASTER_PORT",
    "DEFAULT_WAIT_TIMEOUT_S",
    "edge_device_map",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_STOPPED",
    "EXIT_TERMINATED",
    "EXIT_UNREACHABLE",
    "EXIT_USER_ERROR",
    "exported_env",
    "EXPORTED_VARS",
    "Failure",
    "format_progress_bar",
    "format_progress_line",
    "GLOO_SOCKET_IFNAME",
    "GuardedGroup",
    "HEADLESS_SERVICE",
    "host_name",
    "HOSTNAME",
    "INDEX",
    "JOB_INDEX",
    "JOB_INDEX_LABEL",
    "JOBSET_FIELDS",
    "jobset_host_name",
    "JOBSET_NAME",
    "JOBSET_NAME_LABEL",
    "JOBSET_POD_ENV_VARS",
    "jobset_role",
    "load_yaml",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MODULES",
    "NCCL_SOCKET_IFNAME",
    "node_rank",
    "one_line",
    "os_error_line",
    "PARAMETERLESS_MODULES",
    "parse_jobset_host_name",
    "parse_pod_name",
    "parse_progress_line",
    "placement_problems",
    "PLAN_VERSION",
    "PlanFormatError",
    "POD_ENV_VARS",
    "POD_IP",
    "POD_NAME",
    "pod_name",
    "POD_NAMESPACE",
    "POD_PLAN",
    "PodPlan",
    "process_group_backend",
    "PROGRESS_BAR_WIDTH",
    "PROGRESS_KINDS",
    "progress_values",
    "RANK",
    "READ_VARS",
    "REPLICATED_JOB",
    "REPLICATED_JOB_LABEL",
    "REPLICATED_JOBS",
    "RESTART_ATTEMPT_LABEL",
    "ROLE",
    "ROLES",
    "SOCKET_IFNAME_VARS",
    "StagePlacement",
    "TERMINATION_GRACE_SECONDS",
    "TOPOLOGY",
    "TP_SOCKET_IFNAME",
    "TRAINER_CMD",
    "TRAINER_READ_VARS",
    "USER_ENV_VARS",
    "validate_placement",
    "WAIT_TIMEOUT",
    "WORKLOADS",
    "WORLD_SIZE",
]
