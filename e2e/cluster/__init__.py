"""The emulated Kubernetes the scenarios deploy to: pods as docker containers on one network, the
kubelet's restartPolicy Always, and the Job and JobSet controllers. README.md here lists every way it
differs from a real cluster.

Fenced: scenarios use only the names below (never a module of this package), and nothing here knows
of scenarios, their checks or the trainer (tests/e2e/test_e2e_layout.py holds both sides to it).

  pods.py         workload objects -> `PodSpec`s (downward API, `$(VAR)` expansion, volumes, security)
  containers.py   `PodSpec` -> `docker create` arguments
  docker.py       the bounded `docker` call; `Cluster`: a network and its containers, always removed
  kubelet.py      restartPolicy Always with the crash-loop back-off
  failure_rules.py  how the Job and JobSet controllers match a failure against their rules
  job.py          the Job controller's verdict on an Indexed Job (podFailurePolicy, backoffLimit)
  jobset_spec.py  the rendered JobSet, parsed; what is not emulated is refused
  jobset.py       the JobSet controller: group restarts, failure and success policies
  trainer.py      Kubeflow Trainer v2's controller: a TrainJob and its runtime -> the JobSet (and PET_*)
"""

from .containers import pvc_dir, quantity_bytes
from .docker import Cluster, ContainerState, DockerError, clean_all, daemon_answers, image_exists
from .failure_rules import DISRUPTION_REASONS
from .job import Job, Pod
from .jobset import Attempt, JobSetController, jobset_controller
from .kubelet import Kubelet
from .pods import Mount, PodSpec, SpecError, statefulset_pods
from .trainer import StatusServer, trainjob_objects

__all__ = [
    "Attempt",
    "Cluster",
    "DISRUPTION_REASONS",
    "ContainerState",
    "DockerError",
    "Job",
    "JobSetController",
    "Kubelet",
    "Mount",
    "Pod",
    "PodSpec",
    "SpecError",
    "StatusServer",
    "clean_all",
    "daemon_answers",
    "image_exists",
    "jobset_controller",
    "pvc_dir",
    "quantity_bytes",
    "statefulset_pods",
    "trainjob_objects",
]
