"""Golden tests of `maskrcnn-launch plan` (table and --json) for the packaged topologies.

Regenerate after an intended change, then review the diff:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/launcher/test_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from maskrcnn_launcher.cli import main
from maskrcnn_launcher.contract import PodPlan

GOLDEN = Path(__file__).parent / "golden"
TOPOLOGIES = ["three-machines", "three-machines-gpu", "ddp"]


def run_plan(*args: str) -> str:
    # An empty MASKRCNN_TOPOLOGY keeps a caller's environment from choosing the topology.
    result = CliRunner().invoke(main, ["plan", *args], env={"MASKRCNN_TOPOLOGY": ""})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_plan_matches_golden(name: str, as_json: bool) -> None:
    output = run_plan("--topology", name, *(["--json"] if as_json else []))
    path = GOLDEN / f"plan-{name}.{'json' if as_json else 'txt'}"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(output)
    assert output == path.read_text(), f"plan output changed; see the module docstring to regenerate {path.name}"


def test_default_topology_is_three_machines() -> None:
    assert run_plan() == (GOLDEN / "plan-three-machines.txt").read_text()


def test_json_pods_carry_their_pod_plans() -> None:
    """Each pod's `plan` is exactly what its trainer reads from MASKRCNN_POD_PLAN; the launcher-only
    facts (DNS name, node layout) sit next to it, and the links once for the job."""
    import json

    doc = json.loads(run_plan("--json", "--prefix", "job", "--namespace", "ml", "--service", "job-hl"))
    assert [p["dns_name"] for p in doc["pods"]] == [
        f"job-{r}.job-hl.ml.svc.cluster.local" for r in ("master-0", "worker-0", "worker-1")
    ]
    plans = [PodPlan.from_dict(p["plan"]) for p in doc["pods"]]
    assert {p.master_addr for p in plans} == {"job-master-0.job-hl.ml.svc.cluster.local"}
    assert [(p.rank, p.rpc_name) for p in plans] == [(0, "master"), (1, "worker1"), (2, "worker2")]
    assert [p["node_rank"] for p in doc["pods"]] == [0, 1, 2] and len(doc["links"]) == 4


def test_plan_names_the_jobset_pods() -> None:
    """`--workload jobset`: the chart's JobSet host names (<jobset>-master-0-0, <jobset>-workers-0-<i>),
    the master's address among them; ranks and plans are the StatefulSets'."""
    import json

    args = ("--json", "--prefix", "job", "--namespace", "ml", "--service", "job-hl")
    doc = json.loads(run_plan(*args, "--workload", "jobset"))
    assert [p["dns_name"] for p in doc["pods"]] == [
        f"job-{h}.job-hl.ml.svc.cluster.local" for h in ("master-0-0", "workers-0-0", "workers-0-1")
    ]
    plans = [PodPlan.from_dict(p["plan"]) for p in doc["pods"]]
    assert {p.master_addr for p in plans} == {"job-master-0-0.job-hl.ml.svc.cluster.local"}
    statefulset = json.loads(run_plan(*args))
    assert [p.rank for p in plans] == [p["plan"]["rank"] for p in statefulset["pods"]]
    assert "job-workers-0-1.job-hl.ml.svc.cluster.local" in run_plan("--workload", "jobset", *args[1:])
