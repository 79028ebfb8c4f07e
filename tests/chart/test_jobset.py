"""The JobSet workload: validated against the published JobSet v0.12.0 CRD (schemas/), rendered by
`workload: auto` only where the cluster serves the API, running to completion and restarting as a
group, every pod launching as its rank from the downward API or its host name.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from maskrcnn_launcher import contract

from .conftest import RELEASE
from .launch import jobset_fields, launch_dry_run, launcher_command, pod_environment, write_topology
from .objects import (
    CASE_IDS,
    CASES,
    JOBSET_CASE_IDS,
    JOBSET_CASES,
    SCENARIO_NAMES,
    expected_workload,
    gpu_resource,
    one,
    pod_labels,
    replicated_jobs,
    selects,
    topology_of,
    trainer,
    workload,
)
from .validate import validate_jobset

pytestmark = pytest.mark.needs_helm


def test_jobset_cases_cover_every_scenario() -> None:
    assert {s for s, _ in JOBSET_CASES} == set(SCENARIO_NAMES)
    assert ("jobset", False) in JOBSET_CASES, "ci/jobset-values.yaml asks for a JobSet without the API"


@pytest.mark.parametrize(("scenario", "jobset_api"), JOBSET_CASES, ids=JOBSET_CASE_IDS)
def test_jobset_validates_against_the_published_crd(render, jobset_schema, scenario: str, jobset_api: bool) -> None:
    validate_jobset(one(render(scenario, jobset_api=jobset_api), "JobSet"), jobset_schema)


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_auto_renders_a_jobset_only_where_the_cluster_serves_it(
    render, values, scenario: str, jobset_api: bool
) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    assert workload(objects) == expected_workload(values(scenario), jobset_api)
    for forced in ("statefulset", "jobset"):
        assert workload(render(scenario, f"workload={forced}", jobset_api=jobset_api)) == forced


@pytest.mark.parametrize(("scenario", "jobset_api"), JOBSET_CASES, ids=JOBSET_CASE_IDS)
def test_jobset_runs_to_completion_and_restarts_as_a_group(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    v = values(scenario)
    jobset = one(objects, "JobSet")
    spec = jobset["spec"]
    topology = topology_of(objects)
    service = one(objects, "Service")
    assert jobset["metadata"]["name"] == f"{RELEASE}-maskrcnn-dist"
    # Host names <jobset>-<replicated job>-<job index>-<pod index> under the headless Service.
    assert spec["network"] == {
        "enableDNSHostnames": True,
        "subdomain": service["metadata"]["name"],
        "publishNotReadyAddresses": True,
    }
    for role, labels in pod_labels(objects).items():
        if role != "test":
            assert selects({"matchLabels": service["spec"]["selector"]}, labels), role
    # The master's job completing is success: the controller then deletes the workers' job.
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["master"]}
    # What a failed pod does to the JobSet (the rules themselves): test_failure_policy.py.
    policy = spec["failurePolicy"]
    assert policy["maxRestarts"] == v["jobset"]["failurePolicy"]["maxRestarts"]
    assert policy["restartStrategy"] == v["jobset"]["failurePolicy"]["restartStrategy"]
    ttl = v["jobset"]["ttlSecondsAfterFinished"]
    assert spec.get("ttlSecondsAfterFinished") == ttl
    counts = {"master": 1, "worker": len(topology.workers)}
    rjobs = replicated_jobs(objects)
    assert [r["name"] for r in spec["replicatedJobs"]] == ["master", "workers"][: len(rjobs)]
    for role, rjob in rjobs.items():
        job = rjob["template"]["spec"]
        assert rjob["replicas"] == 1, "one Indexed Job per role: worker i is completion index i"
        assert job["completionMode"] == "Indexed"
        assert job["completions"] == job["parallelism"] == counts[role], role
        assert job["backoffLimit"] == 0, "one failed pod fails its Job, and the JobSet decides"
        assert job["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy needs restartPolicy Never"
        assert selects({"matchLabels": rjob["template"]["metadata"]["labels"]}, job["template"]["metadata"]["labels"])


def test_a_ddp_job_without_workers_is_a_master_alone(render) -> None:
    objects = render("ddp", "ddp.workers=0", "workload=jobset")
    assert [r["name"] for r in one(objects, "JobSet")["spec"]["replicatedJobs"]] == ["master"]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIO_NAMES)
@pytest.mark.parametrize("labelled", [True, False], ids=["downward-api", "host-name"])
def test_every_jobset_pod_launches_as_its_rank(render, scenario: str, labelled: bool, tmp_path: Path) -> None:
    """`launch --dry-run` in every pod the JobSet will make: same ranks and device counts as the
    StatefulSets, the master at its JobSet DNS name, from the downward API or else the host name."""
    objects = render(scenario, "workload=jobset")
    topology_file = write_topology(objects, tmp_path)
    topology = topology_of(objects)
    jobset = one(objects, "JobSet")
    name, subdomain = jobset["metadata"]["name"], jobset["spec"]["network"]["subdomain"]
    master_addr = f"{name}-master-0-0.{subdomain}.default.svc.cluster.local"
    gpu = gpu_resource(objects)
    for role, rjob in replicated_jobs(objects).items():
        container = trainer(rjob["template"]["spec"]["template"])
        gpus = int(container.get("resources", {}).get("limits", {}).get(gpu, 0))
        for index in range(rjob["template"]["spec"]["completions"]):
            pod = f"{name}-{rjob['name']}-0-{index}"
            fields = jobset_fields(name, rjob["name"], index, labelled)
            env = pod_environment(container, f"{pod}-x7k2p", f"10.0.0.{index + 2}", topology_file, fields, pod)
            plan, out, _ = launch_dry_run(container, env, pod)
            assert (plan.role, plan.index) == (role, index), pod
            assert out["pod"]["node_rank"] == contract.node_rank(role, index), pod
            assert (plan.master_addr, plan.master_port) == (master_addr, topology.network.master_port), pod
            assert out["pod"]["dns_name"] == f"{pod}.{subdomain}.default.svc.cluster.local"
            assert out["pod"]["devices"] == gpus, pod
            source = "MASKRCNN_REPLICATED_JOB=" if labelled else "HOSTNAME="
            assert out["identity_source"].startswith(source), out["identity_source"]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["default", "ddp", "jobset"])
def test_plan_prints_the_jobset_dns_names(render, scenario: str, tmp_path: Path) -> None:
    """`maskrcnn-launch plan --workload jobset` names the hosts the chart's JobSet gets."""
    objects = render(scenario, "workload=jobset")
    jobset = one(objects, "JobSet")
    name, subdomain = jobset["metadata"]["name"], jobset["spec"]["network"]["subdomain"]
    hosts = [
        f"{name}-{rjob['name']}-{j}-{i}"
        for rjob in jobset["spec"]["replicatedJobs"]
        for j in range(rjob["replicas"])
        for i in range(rjob["template"]["spec"]["completions"])
    ]
    topology = write_topology(objects, tmp_path)
    command = ["plan", "--json", "--workload", "jobset", "--topology", str(topology), "--prefix", name]
    proc = subprocess.run([*launcher_command(), *command, "--service", subdomain], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [p["dns_name"] for p in json.loads(proc.stdout)["pods"]] == [
        f"{h}.{subdomain}.default.svc.cluster.local" for h in hosts
    ]


@pytest.mark.parametrize("jobset_api", [False, True])
def test_kueue_reads_its_queue_label_on_the_jobset(render, values, jobset_api: bool) -> None:
    """Kueue reads kueue.x-k8s.io/queue-name on the top-level object: podLabels and podAnnotations
    go on the JobSet itself, besides its pods."""
    v = values("jobset")
    assert "kueue.x-k8s.io/queue-name" in v["podLabels"]
    jobset = one(render("jobset", jobset_api=jobset_api), "JobSet")
    assert jobset["metadata"]["labels"].items() >= v["podLabels"].items()
    assert jobset["metadata"]["annotations"] == v["podAnnotations"]
    assert "annotations" not in one(render("cpu", jobset_api=True), "JobSet")["metadata"]
