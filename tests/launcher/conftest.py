"""What several launcher test files share: a stand-in trainer the launcher execs, the topology it runs
under, and an environment free of the variables the launcher reads; Kubernetes API objects (pods, a
JobSet) as the API server returns them for a release of the chart, for the `status` tests."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from maskrcnn_launcher import contract

from .fake_api import FakeCluster, serve

STAND_IN = textwrap.dedent(
    """
    import json, os, socket, sys

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    said_hello = []
    if rank == 0:
        # Like rank 0's TCPStore: listen on MASTER_PORT until every worker has said hello. The
        # workers' launchers probe the port first (connect, close: an empty read).
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(60)
            while len(said_hello) < world - 1:
                conn, _ = server.accept()
                with conn:
                    data = conn.recv(16)
                    if data:
                        said_hello.append(int(data))
    else:
        with socket.create_connection((addr, port), timeout=60) as conn:
            conn.sendall(str(rank).encode())
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "MASKRCNN_POD_PLAN", "TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "hello": sorted(said_hello),
                      "env": {n: os.environ.get(n) for n in names}}))
    """
)

TOPOLOGY = """\
engine: pipeline
workers:
  - {devices: 0, stage: stage1}
  - {devices: 0, stage: stage2, replicas: 2}
stages:
  - {name: stage1, modules: [transform, backbone]}
  - {name: stage2, modules: [rpn, roi_heads]}
network: {master_port: 29500, interface: lo}
"""


def clean_env() -> dict[str, str]:
    """The test's environment without any variable the launcher reads (a CI runner may set HOSTNAME)."""
    env = {k: v for k, v in os.environ.items() if k not in contract.READ_VARS and k not in contract.EXPORTED_VARS}
    env["HOSTNAME"] = "test-host"
    return env


# -- Kubernetes API objects of a release, as the API server returns them ------------------------------

PREFIX = "demo-maskrcnn-dist"
MASTER_LOG = "\n".join(
    [
        "2025-01-01 10:00:00 INFO maskrcnn_dist.train: synthetic COCO set with 64 training images",
        "train step 10/150 loss_classifier 0.3 loss_box_reg 0.2 loss_mask 0.6 loss 1.5 lr 0.004 images_per_s 2.1",
        "val step 10/150 loss 1.4",
        "train step 20/150 loss_classifier 0.25 loss_box_reg 0.18 loss_mask 0.5 loss 1.234 lr 0.008 images_per_s 2.5",
        "2025-01-01 10:00:09 INFO maskrcnn_dist.engines.base: saved runs/checkpoints/ckpt_00000020.pt",
        "",
    ]
)


def api_pod(
    name: str,
    *,
    release: str = "demo",
    component: str | None = None,
    phase: str = "Running",
    node: str | None = "node-a",
    restarts: int = 0,
    waiting: str | None = None,
) -> dict[str, Any]:
    """A pod as the API returns it, labelled as the chart labels it."""
    component = component or ("master" if "-master-" in name else "worker")
    labels = {
        "app.kubernetes.io/name": "maskrcnn-dist",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/part-of": "maskrcnn-dist",
        "app.kubernetes.io/component": component,
    }
    statuses = []
    if phase != "Pending" or restarts:
        state = {"waiting": {"reason": waiting}} if waiting else {"running": {"startedAt": "2025-01-01T10:00:00Z"}}
        statuses = [
            {
                "name": "trainer",
                "image": "maskrcnn-dist:0.1.0",
                "imageID": "",
                "ready": waiting is None,
                "restartCount": restarts,
                "state": state,
            }
        ]
    return {
        "metadata": {"name": name, "namespace": "ml", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "maskrcnn-dist:0.1.0"}]},
        "status": {"phase": phase, "containerStatuses": statuses},
    }


def api_jobset_pod(rjob: str, index: int, attempt: int = 0, *, phase: str = "Running", **kwargs: Any) -> dict[str, Any]:
    """A pod of the chart's JobSet as the API returns it: the Job's pod name (host name + suffix), the
    JobSet and Job controllers' labels and annotations, spec.hostname."""
    host = f"{PREFIX}-{rjob}-0-{index}"
    pod = api_pod(
        f"{host}-{('bcdfg', 'hjklm')[attempt]}",
        component="master" if rjob == "master" else "worker",
        phase=phase,
        **kwargs,
    )
    keys = {
        "jobset.sigs.k8s.io/jobset-name": PREFIX,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob,
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/restart-attempt": str(attempt),
    }
    pod["metadata"]["labels"].update(keys)
    pod["metadata"]["annotations"] = {**keys, "batch.kubernetes.io/job-completion-index": str(index)}
    pod["spec"].update({"hostname": host, "subdomain": f"{PREFIX}-headless"})
    if phase == "Succeeded":
        terminated = {"exitCode": 0, "reason": "Completed", "startedAt": "2025-01-01T10:00:00Z"}
        pod["status"]["containerStatuses"][0]["state"] = {"terminated": terminated}
    return pod


def api_jobset(
    *, restarts: int = 0, condition: tuple[str, str, str] | None = None, suspend: bool = False
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": "demo", "app.kubernetes.io/part-of": "maskrcnn-dist"}
    conditions = []
    if condition is not None:
        kind, reason, message = condition
        conditions.append({"type": kind, "status": "True", "reason": reason, "message": message})
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": PREFIX, "namespace": "ml", "labels": labels},
        "spec": {"suspend": suspend, "failurePolicy": {"maxRestarts": 3}},
        "status": {"restarts": restarts, "conditions": conditions, "terminalState": condition and condition[0]},
    }


@pytest.fixture
def cluster() -> Iterator[tuple[FakeCluster, str]]:
    """A fake Kubernetes API server on a random loopback port (fake_api.py): (its state, its URL)."""
    with serve() as served:
        yield served
