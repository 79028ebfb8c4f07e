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
  the trainer writes it, `status` reads it back);
- `processes.py`: the processes under a supervisor (`child_pids`, `parent_pid`, `process_tree`, `stopped_pids`,
  `end_process_tree`): the torchrun wrapper's ranks and `local`'s pods, which leave their process groups;
- `signals.py`: the signals that stop a trainer and the forwarded one (`STOP_SIGNALS`, `FORWARDED_STOP`),
  and `signal_handlers`, the one way both packages take signals for a block and give them back.
Every name is re-exported here: callers import from `maskrcnn_launcher.contract`, not from its modules.

The exit codes and the error boundary every entry point runs in (boundary.py) are re-exported here:
Kubernetes acts on a pod's exit code (a JobSet fails at once on a user error), so the trainer's
processes must exit the way the launcher's do. So is the reader of the YAML files a user writes
(yamlfile.py: a key given twice is an error), so a topology and a trainer `--config` are read alike;
`shared.py` names these borrowed names.

Each module declares its public names in its `__all__`, once; this face star-imports every module
and composes `__all__` from theirs. A new module `x.py` with its `__all__` is added below as `x` in the
module import, `from maskrcnn_launcher.contract.x import *` and `*x.__all__` (tests/test_faces.py fails
while a module or a name is left out, or a private name is exported).

Only the standard library (and click for the boundary, PyYAML for the YAML reader) is imported: the
trainer imports this package next to torch, the launcher without it.
"""

# ruff: noqa: F403 -- the face re-exports each module's `__all__` (the names are listed once, there).
from __future__ import annotations

from maskrcnn_launcher.contract import env, hosts, placement, pod_plan, processes, progress, shared, signals
from maskrcnn_launcher.contract.env import *
from maskrcnn_launcher.contract.hosts import *
from maskrcnn_launcher.contract.placement import *
from maskrcnn_launcher.contract.pod_plan import *
from maskrcnn_launcher.contract.processes import *
from maskrcnn_launcher.contract.progress import *
from maskrcnn_launcher.contract.shared import *
from maskrcnn_launcher.contract.signals import *

__all__ = [
    *env.__all__,
    *hosts.__all__,
    *placement.__all__,
    *pod_plan.__all__,
    *processes.__all__,
    *progress.__all__,
    *shared.__all__,
    *signals.__all__,
]
