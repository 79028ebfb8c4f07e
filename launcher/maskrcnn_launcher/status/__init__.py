"""`maskrcnn-launch status`: a release's pods and the master's latest progress, from the Kubernetes API.

It lives on the launcher's side because it talks to the Kubernetes API and must never import torch
(`maskrcnn-dist status` forwards here). It meets the trainer only through the contract. Two parts:
`client.py` asks the API server (the only module that imports `kubernetes`, an optional extra, and
only inside its functions), `report.py` reads the answers into plain records and renders them (pure
functions over the API's JSON, tested without a server), and `trainjob.py` does the same for a
Kubeflow Trainer TrainJob (`--trainjob`): its state, the progress and AP in its status, its pods.
"""

from maskrcnn_launcher.status.client import (
    ClusterConfigError,
    ClusterError,
    ClusterPermissionError,
    ClusterUnreachableError,
    Connection,
    NamespaceNotFoundError,
    ReleaseNotFoundError,
    connect,
    release_status,
    trainjob_status,
)
from maskrcnn_launcher.status.report import JobSetStatus, PodStatus, Progress, ReleaseStatus, render_status
from maskrcnn_launcher.status.trainjob import TrainerStatus, TrainJobStatus, read_trainjob, render_trainjob

__all__ = [
    "ClusterConfigError",
    "ClusterError",
    "ClusterPermissionError",
    "ClusterUnreachableError",
    "Connection",
    "JobSetStatus",
    "NamespaceNotFoundError",
    "PodStatus",
    "Progress",
    "ReleaseNotFoundError",
    "ReleaseStatus",
    "connect",
    "read_trainjob",
    "release_status",
    "render_status",
    "render_trainjob",
    "TrainerStatus",
    "TrainJobStatus",
    "trainjob_status",
]
