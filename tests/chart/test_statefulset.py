"""The StatefulSet workload: two StatefulSets behind the headless Service, every pod launching as its
rank, and the PodDisruptionBudget.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import RELEASE
from .launch import launch_dry_run, pod_environment, write_topology
from .objects import (
    GPU,
    SCENARIO_NAMES,
    by_kind,
    one,
    pod_labels,
    selects,
    statefulsets,
    topology_of,
    trainer,
    workload,
)

pytestmark = pytest.mark.needs_helm


@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_statefulsets_and_headless_service(render, scenario: str) -> None:
    objects = render(scenario, "workload=statefulset")
    sets = statefulsets(objects)
    topology = topology_of(objects)
    service = one(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == topology.network.master_port
    for role, sts in sets.items():
        assert sts["metadata"]["name"] == f"{RELEASE}-maskrcnn-dist-{role}"
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        assert selects({"matchLabels": service["spec"]["selector"]}, sts["spec"]["template"]["metadata"]["labels"])
        assert selects(sts["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
        assert "restartPolicy" not in sts["spec"]["template"]["spec"], "StatefulSets allow only Always"
    assert sets["master"]["spec"]["replicas"] == 1
    assert sets["worker"]["spec"]["replicas"] == len(topology.workers)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
def test_every_pod_spec_launches_as_its_rank(render, scenario: str, tmp_path: Path) -> None:
    """Run the launcher (`launch --dry-run`) with each rendered pod's environment and arguments."""
    objects = render(scenario, "workload=statefulset")
    topology_file = write_topology(objects, tmp_path)
    topology = topology_of(objects)
    service = one(objects, "Service")["metadata"]["name"]
    master_addr = f"{RELEASE}-maskrcnn-dist-master-0.{service}.default.svc.cluster.local"
    for role, sts in statefulsets(objects).items():
        container = trainer(sts["spec"]["template"])
        gpus = int(container.get("resources", {}).get("limits", {}).get(GPU, 0))
        for ordinal in range(sts["spec"]["replicas"]):
            pod = f"{sts['metadata']['name']}-{ordinal}"
            env = pod_environment(container, pod, f"10.0.0.{ordinal + 2}", topology_file)
            plan, out, args = launch_dry_run(container, env, pod)
            assert (plan.role, plan.index) == (role, ordinal), pod
            # Launcher-only facts (node layout, GPU count) are in the dry run's `pod`, not the trainer's plan.
            assert out["pod"]["node_rank"] == (0 if role == "master" else ordinal + 1), pod
            assert (plan.master_addr, plan.master_port) == (master_addr, topology.network.master_port), pod
            devices = out["pod"]["devices"]
            assert devices == gpus, f"{pod}: the launcher plans {devices} GPUs, the pod gets {gpus}"
            trainer_args = args[args.index("--") + 1 :]
            assert out["argv"][len(out["argv"]) - len(trainer_args) :] == trainer_args, pod


@pytest.mark.parametrize("jobset_api", [False, True])
def test_pod_disruption_budget_only_for_statefulsets(render, jobset_api: bool) -> None:
    objects = render("gpu-3-machines", jobset_api=jobset_api)
    if workload(objects) == "jobset":
        assert not by_kind(objects, "PodDisruptionBudget"), "a JobSet restarts the group after an eviction"
        return
    budget = one(objects, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 0
    labels = pod_labels(objects)
    assert selects(budget["selector"], labels["master"]) and selects(budget["selector"], labels["worker"])
    assert not selects(budget["selector"], labels["test"])
    assert not by_kind(render("default"), "PodDisruptionBudget"), "off by default"
