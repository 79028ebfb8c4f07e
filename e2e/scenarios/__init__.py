"""The end-to-end scenarios, by workload. Each deploys the chart's pods as containers, acts, and asserts.

Every scenario is bounded in time (each wait has its own limit, and `make e2e` adds one over the
whole run) and runs inside a `Deployment` (deployment.py) that removes its containers and network
whatever happened. `SCENARIOS` is the registry `python -m e2e` runs, lists and selects from, in
this order (one at a time; `--jobs N` starts them by MEASURED_SECONDS, the longest first).

  common.py       release names, bounds, settings, the trainer's small CPU run
  chart.py        the chart: ci/ values files, `helm template`, the rendered release
  deployment.py   one scenario's deployment and its waits
  statefulset.py  pipeline, ddp, fault recovery (StatefulSets)
  bare_nodes.py   the `docker run` recipe of docs/deploy-bare-nodes.md
  jobset.py       the JobSet workload under the emulated controllers
  trainjob.py     the Kubeflow Trainer runtime and TrainJob under the emulated Trainer and JobSet controllers
  preemption.py   a pod stopped with SIGTERM and its grace period (pipeline, ddp), a disrupted JobSet
  elastic.py      the elastic ddp JobSet: a worker pod lost and replaced alone, no group restart
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .bare_nodes import scenario_bare_nodes
from .chart import ROOT
from .common import Result, Settings
from .elastic import scenario_jobset_elastic
from .jobset import (
    scenario_jobset,
    scenario_jobset_lost_worker,
    scenario_jobset_max_restarts,
    scenario_jobset_user_error,
    scenario_jobset_user_error_ddp,
)
from .preemption import scenario_jobset_disruption, scenario_preempt_ddp, scenario_preempt_pipeline
from .statefulset import (
    scenario_ddp,
    scenario_ddp_fault,
    scenario_faults,
    scenario_pipeline,
    scenario_restart_alone,
    scenario_silent_peer,
)
from .trainjob import scenario_trainjob

SCENARIOS: dict[str, Callable[[Settings], dict[str, Any]]] = {
    "pipeline": scenario_pipeline,
    "ddp": scenario_ddp,
    "bare-nodes": scenario_bare_nodes,
    "faults": scenario_faults,
    "restart-alone": scenario_restart_alone,
    "silent-peer": scenario_silent_peer,
    "ddp-fault": scenario_ddp_fault,
    "jobset": scenario_jobset,
    "jobset-lost-worker": scenario_jobset_lost_worker,
    "jobset-user-error": scenario_jobset_user_error,
    "jobset-user-error-ddp": scenario_jobset_user_error_ddp,
    "jobset-max-restarts": scenario_jobset_max_restarts,
    "trainjob": scenario_trainjob,
    "preempt-pipeline": scenario_preempt_pipeline,
    "preempt-ddp": scenario_preempt_ddp,
    "jobset-disruption": scenario_jobset_disruption,
    "jobset-elastic": scenario_jobset_elastic,
}
# Seconds each took in a serial run on a 2-core machine (runs/e2e/summary.json): `--jobs N` starts
# the longest first, so that short ones fill in at the end. Refresh after a scenario's length changes
# a lot; one missing here counts as the longest.
MEASURED_SECONDS: dict[str, float] = {
    "pipeline": 72,
    "ddp": 25,
    "bare-nodes": 30,
    "faults": 81,
    "restart-alone": 70,
    "silent-peer": 93,
    "ddp-fault": 66,
    "jobset": 46,
    "jobset-lost-worker": 72,
    "jobset-user-error": 22,
    "jobset-user-error-ddp": 30,
    "jobset-max-restarts": 21,
    "trainjob": 32,
    "preempt-pipeline": 53,
    "preempt-ddp": 63,
    "jobset-disruption": 131,
    "jobset-elastic": 134,
}
# Until the pipeline engine lands, `--engines ddp` runs only what needs no pipeline.
DDP_ONLY = ("ddp", "ddp-fault", "jobset-user-error-ddp", "trainjob", "preempt-ddp", "jobset-elastic")

__all__ = ["DDP_ONLY", "MEASURED_SECONDS", "ROOT", "SCENARIOS", "Result", "Settings"]
