"""`status --trainjob`: a Kubeflow Trainer TrainJob's state, the progress, ETA and metrics (loss, lr, images/s,
AP) in its status.trainerStatus, and its pods ranked by completion index; rendered from the API's JSON
without a server, then read through the real `kubernetes` client from the fake API server (fake_api.py).

The TrainJob's shape is the published v2.3.0 CRD's (schemas/trainer.kubeflow.org_trainjobs-v2.3.0.yaml), its
trainerStatus what the kit's trainer posts (src/maskrcnn_dist/progress_post.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from maskrcnn_launcher.cli import main
from maskrcnn_launcher.status.trainjob import read_trainjob, render_trainjob

from .conftest import api_pod
from .fake_api import FakeCluster, write_kubeconfig

POSTED = {
    "progressPercentage": 45,
    "estimatedRemainingSeconds": 3725,
    "metrics": [
        {"name": "loss", "value": "0.2347"},
        {"name": "lr", "value": "0.02"},
        {"name": "images_per_s", "value": "8.5"},
        {"name": "bbox_AP", "value": "0.3125"},
        {"name": "segm_AP", "value": "0.25"},
    ],
    "lastUpdatedTime": "2026-06-12T03:00:00Z",
}


def api_trainjob(name: str = "coco", trainer_status: dict[str, Any] | None = POSTED, **status: Any) -> dict[str, Any]:
    """A TrainJob as the API server returns it."""
    obj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"runtimeRef": {"name": "maskrcnn-dist", "kind": "ClusterTrainingRuntime"}, "trainer": {"numNodes": 2}},
        "status": {**({"trainerStatus": trainer_status} if trainer_status else {}), **status},
    }
    return obj


def api_node_pod(trainjob: str, rank: int, **kwargs: Any) -> dict[str, Any]:
    """A pod of a TrainJob's JobSet: replicated job `node`, the controllers' labels and completion index."""
    host = f"{trainjob}-node-0-{rank}"
    pod = api_pod(f"{host}-x7k2p", component="node", **kwargs)
    keys = {
        "jobset.sigs.k8s.io/jobset-name": trainjob,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/job-index": "0",
    }
    pod["metadata"]["labels"].update(keys)
    pod["metadata"]["annotations"] = {**keys, "batch.kubernetes.io/job-completion-index": str(rank)}
    pod["spec"].update({"hostname": host, "subdomain": trainjob})
    pod["spec"]["containers"] = [{"name": "node", "image": "maskrcnn-dist:0.1.0"}]
    return pod


def test_a_running_trainjob_with_the_progress_its_trainer_posted() -> None:
    status = read_trainjob(api_trainjob(), [api_node_pod("coco", 1, node="n2"), api_node_pod("coco", 0, node="n1")])
    assert [(p.role, p.rank, p.node) for p in status.pods] == [("master", 0, "n1"), ("worker", 1, "n2")]
    assert render_trainjob(status).splitlines() == [
        "trainjob coco in namespace ml: Running, runtime ClusterTrainingRuntime/maskrcnn-dist, 2 node(s), 2 pods, "
        "2 running",
        "POD                  ROLE    RANK  PHASE    RESTARTS  NODE",
        "coco-node-0-0-x7k2p  master  0     Running  0         n1",
        "coco-node-0-1-x7k2p  worker  1     Running  0         n2",
        "progress: 45%  ETA 1h02m05s  updated 2026-06-12T03:00:00Z",
        "metrics: loss 0.2347  lr 0.02  images_per_s 8.5  bbox_AP 0.3125  segm_AP 0.25",
    ]
    doc = json.loads(render_trainjob(status, as_json=True))
    assert doc["trainer"] == {
        "progress_percentage": 45,
        "estimated_remaining_seconds": 3725,
        "metrics": {"loss": "0.2347", "lr": "0.02", "images_per_s": "8.5", "bbox_AP": "0.3125", "segm_AP": "0.25"},
        "last_updated_time": "2026-06-12T03:00:00Z",
    }


@pytest.mark.parametrize(
    ("conditions", "suspend", "head"),
    [
        ([{"type": "Complete", "status": "True", "reason": "AllJobsCompleted"}], False, "Complete (AllJobsCompleted)"),
        (
            [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "jobset failed:\nexit 2"}],
            False,
            "Failed (FailedJobs: jobset failed: exit 2)",
        ),
        ([{"type": "Suspended", "status": "True", "reason": "Suspended"}], False, "Suspended"),
        ([], True, "Suspended"),
        ([{"type": "Complete", "status": "False"}], False, "Running"),
    ],
)
def test_the_state_comes_from_the_conditions(conditions: list[dict], suspend: bool, head: str) -> None:
    obj = api_trainjob(conditions=conditions)
    obj["spec"]["suspend"] = suspend
    assert render_trainjob(read_trainjob(obj, [])).startswith(f"trainjob coco in namespace ml: {head}, runtime")


def test_no_trainer_status_says_why_there_may_be_none() -> None:
    text = render_trainjob(read_trainjob(api_trainjob(trainer_status=None), []))
    assert text.splitlines()[-1] == (
        "progress: none in status.trainerStatus (not posted yet, or Kubeflow Trainer's TrainJobStatus feature gate "
        "is off)"
    )


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, ["status", *args])


def test_status_reads_a_trainjob_through_the_api(cluster: tuple[FakeCluster, str], tmp_path: Path) -> None:
    state, url = cluster
    state.trainjobs["ml"] = [api_trainjob(), api_trainjob("other")]
    state.pods["ml"] = [api_node_pod("coco", 0), api_node_pod("other", 0), api_node_pod("coco", 1)]
    kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig", url))
    result = _run("--trainjob", "coco", "--kubeconfig", kubeconfig)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("trainjob coco in namespace ml: Running") and len(lines) == 6
    assert "metrics: loss 0.2347" in result.output and "other-node" not in result.output
    assert "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/coco" in state.requests
    as_json = json.loads(_run("--trainjob", "coco", "--kubeconfig", kubeconfig, "--json").output)
    assert as_json["trainer"]["progress_percentage"] == 45 and len(as_json["pods"]) == 2


def test_a_missing_or_forbidden_trainjob_is_one_error_line(cluster: tuple[FakeCluster, str], tmp_path: Path) -> None:
    state, url = cluster
    kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig", url))
    missing = _run("--trainjob", "nope", "-n", "ml", "--kubeconfig", kubeconfig)
    assert missing.exit_code == 2
    assert missing.output.strip().splitlines() == [
        "error: no TrainJob 'nope' in namespace ml (or Kubeflow Trainer's API trainer.kubeflow.org/v1alpha1 is not "
        "served there); `kubectl get trainjobs -n ml` lists them"
    ]
    state.forbidden.add("get trainjobs")
    forbidden = _run("--trainjob", "nope", "-n", "ml", "--kubeconfig", kubeconfig)
    assert (
        forbidden.exit_code == 2 and "no permission: cannot get trainjobs.trainer.kubeflow.org nope" in forbidden.output
    )


@pytest.mark.parametrize("args", [[], ["--release", "demo", "--trainjob", "coco"]])
def test_status_wants_a_release_or_a_trainjob(args: list[str]) -> None:
    result = _run(*args)
    assert result.exit_code == 2 and "give --release NAME or --trainjob NAME" in result.output
