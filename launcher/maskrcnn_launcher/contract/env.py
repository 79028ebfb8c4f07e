"""The environment variables of the contract: every name the launcher reads or exports, once.

Like Kubeflow's `envvar.go`. The Helm chart's test compares the rendered pod specs against
`POD_ENV_VARS` and `JOBSET_FIELDS`; the chart refuses an `extraEnv` that sets any variable of the
contract but `USER_ENV_VARS`.
"""

from __future__ import annotations

from maskrcnn_launcher.boundary import DEBUG_ENV

__all__ = [
    "CLUSTER_DOMAIN",
    "COMPLETION_INDEX",
    "COMPLETION_INDEX_ANNOTATION",
    "DEFAULT_CLUSTER_DOMAIN",
    "DEFAULT_MASTER_PORT",
    "DEFAULT_WAIT_TIMEOUT_S",
    "DEVICE_MAP_GUARD",
    "EXPORTED_VARS",
    "GLOO_SOCKET_IFNAME",
    "HEADLESS_SERVICE",
    "HOSTNAME",
    "INDEX",
    "JOBSET_FIELDS",
    "JOBSET_NAME",
    "JOBSET_NAME_LABEL",
    "JOBSET_POD_ENV_VARS",
    "JOB_INDEX",
    "JOB_INDEX_LABEL",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NCCL_SOCKET_IFNAME",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "POD_ENV_VARS",
    "POD_IP",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_PLAN",
    "RANK",
    "READ_VARS",
    "REPLICATED_JOB",
    "REPLICATED_JOB_LABEL",
    "RESTART_ATTEMPT_LABEL",
    "ROLE",
    "SOCKET_IFNAME_VARS",
    "TERMINATION_GRACE_SECONDS",
    "TOPOLOGY",
    "TORCH_RUNTIME_VARS",
    "TP_SOCKET_IFNAME",
    "TRAINER_CMD",
    "TRAINER_MASTER_PORT",
    "TRAINER_NODE",
    "TRAINER_READ_VARS",
    "TRAINER_SERVER_CA_CERT",
    "TRAINER_SERVER_TOKEN",
    "TRAINER_SERVER_URL",
    "TRAINER_SERVER_VARS",
    "TRAINJOB_ANCESTOR_LABEL",
    "TRAINJOB_ANCESTOR_TRAINER",
    "TRAINJOB_POD_ENV_VARS",
    "USER_ENV_VARS",
    "WAIT_TIMEOUT",
    "WORLD_SIZE",
]

# ---------------------------------------------------------------------------------------------
# Variables the launcher reads.
# ---------------------------------------------------------------------------------------------

#: Path of the topology YAML (the chart mounts its ConfigMap there). Flag: `--topology`.
TOPOLOGY = "MASKRCNN_TOPOLOGY"
#: Explicit role on bare nodes: `master` or `worker`. Flag: `--role`. Beats the pod name.
ROLE = "MASKRCNN_ROLE"
#: Explicit 0-based index of the role (worker ordinal; the master is 0). Flag: `--index`.
INDEX = "MASKRCNN_INDEX"
#: StatefulSet pod name `<prefix>-master-0` / `<prefix>-worker-<i>` (downward API metadata.name).
POD_NAME = "POD_NAME"
#: Fallback for POD_NAME: a pod's hostname is its name in a StatefulSet.
HOSTNAME = "HOSTNAME"
#: Namespace of the pod (downward API metadata.namespace): part of the master's DNS name.
POD_NAMESPACE = "POD_NAMESPACE"
#: The pod's IP (downward API status.podIP): recorded in the plan for logs.
POD_IP = "POD_IP"
#: The headless Service (StatefulSet serviceName) that gives every pod a stable DNS name.
HEADLESS_SERVICE = "MASKRCNN_HEADLESS_SERVICE"
#: Cluster DNS domain; `DEFAULT_CLUSTER_DOMAIN` when unset.
CLUSTER_DOMAIN = "MASKRCNN_CLUSTER_DOMAIN"
#: Explicit master address (also exported). Flag: `--master-addr`. Beats the derived DNS name.
MASTER_ADDR = "MASTER_ADDR"
#: Explicit master port (also exported). Flag: `--master-port`. Beats the topology's port.
MASTER_PORT = "MASTER_PORT"
#: Replaces the trainer command (shell words); flag `--trainer-cmd`. For tests and custom images.
TRAINER_CMD = "MASKRCNN_TRAINER_CMD"
#: Seconds to wait for the master's DNS name and then its port. Flag: `--wait-timeout`.
WAIT_TIMEOUT = "MASKRCNN_WAIT_TIMEOUT"

# JobSet pods: the JobSet controller's labels and the Job controller's annotation, through the
# downward API. They name the replicated job and the index directly; the host name
# `<jobset>-<replicated job>-<job index>-<completion index>` is the fallback.
#: The JobSet's name (label jobset.sigs.k8s.io/jobset-name): the first part of every host name.
JOBSET_NAME = "MASKRCNN_JOBSET_NAME"
#: The pod's replicated job (label jobset.sigs.k8s.io/replicatedjob-name): `master` or `workers`.
REPLICATED_JOB = "MASKRCNN_REPLICATED_JOB"
#: The index of the pod's Job in its replicated job (label jobset.sigs.k8s.io/job-index).
JOB_INDEX = "MASKRCNN_JOB_INDEX"
#: The pod's completion index in its Indexed Job (annotation batch.kubernetes.io/job-completion-index).
COMPLETION_INDEX = "MASKRCNN_COMPLETION_INDEX"

# Kubeflow Trainer v2's torch runtime: what its Torch plugin injects into the `node` container of a
# TrainJob's pods (kubeflow/trainer v2.3.0 pkg/constants/constants.go, TorchEnv*, set by
# pkg/runtime/framework/plugins/torch/torch.go EnforceMLPolicy). torchrun reads the same names itself
# (torch/distributed/argparse_util.py: `PET_` + the flag), the launcher reads them as one more identity.
#: The node count, `numNodes` of the TrainJob (or the runtime's mlPolicy.numNodes): a decimal number.
PET_NNODES = "PET_NNODES"
#: Processes per node: the TrainJob's numProcPerNode as a number, or `auto` (GPUs in resourcesPerNode and
#: no numProcPerNode: torchrun starts one per visible GPU); without GPUs the plugin writes the CPU count.
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
#: The node rank: the downward API over the Job's completion index annotation
#: (`metadata.annotations['batch.kubernetes.io/job-completion-index']`), 0 for the master.
PET_NODE_RANK = "PET_NODE_RANK"
#: `<trainjob>-node-0-0.<trainjob>`: node 0's host name under the JobSet's subdomain (the TrainJob's name).
PET_MASTER_ADDR = "PET_MASTER_ADDR"
#: `constants.ContainerTrainerPort` (29500), also the `node` container's port.
PET_MASTER_PORT = "PET_MASTER_PORT"
TORCH_RUNTIME_VARS = (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)
#: Trainer's fixed rendezvous port (constants.ContainerTrainerPort): PET_MASTER_PORT's value.
TRAINER_MASTER_PORT = 29500
#: The replicated job and the container the Torch plugin fills (constants.Node), and the label that
#: marks the runtime's replicated job as the trainer's (constants.LabelTrainJobAncestor = AncestorTrainer).
TRAINER_NODE = "node"
TRAINJOB_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINJOB_ANCESTOR_TRAINER = "trainer"
#: What the kit's training runtime's pod spec sets (helm/templates/trainingruntime.yaml): the topology and
#: the pod's own names. The identity comes from PET_*, the master's address from PET_MASTER_ADDR.
TRAINJOB_POD_ENV_VARS = (TOPOLOGY, POD_NAME, POD_NAMESPACE, POD_IP)

# Kubeflow Trainer v2.2+ with the TrainJobStatus feature gate: where a TrainJob's training process posts its
# progress (docs/user-guides/trainjob-progress.md; pkg/runtime/framework/plugins/trainjobstatus). The
# trainer reads them (src/maskrcnn_dist/progress_post.py).
#: The HTTPS endpoint: `https://<controller service>.<namespace>.svc:<port>/apis/trainer.kubeflow.org/v1alpha1/
#: namespaces/<namespace>/trainjobs/<name>/status`, POSTed `{"trainerStatus": {...}}`.
TRAINER_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"
#: A path: the PEM CA certificate the endpoint's certificate is signed by (/var/run/secrets/kubeflow/trainer/ca.crt).
TRAINER_SERVER_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
#: A path: the projected service-account token (a JWT the kubelet rotates; /var/run/secrets/kubeflow/trainer/token),
#: sent as `Authorization: Bearer <token>`.
TRAINER_SERVER_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
TRAINER_SERVER_VARS = (TRAINER_SERVER_URL, TRAINER_SERVER_CA_CERT, TRAINER_SERVER_TOKEN)

# ---------------------------------------------------------------------------------------------
# Variables the trainer reads from the pod spec (the launcher passes them on untouched).
# ---------------------------------------------------------------------------------------------

#: The pod's terminationGracePeriodSeconds, in seconds: how long a stop (SIGTERM -> the step in
#: progress -> a checkpoint) may take before Kubernetes sends SIGKILL. The chart sets it from the same
#: value; the trainer warns once when one step plus one checkpoint write does not fit. Unset: no check.
TERMINATION_GRACE_SECONDS = "MASKRCNN_TERMINATION_GRACE_SECONDS"
#: Every variable the trainer itself reads from the pod spec.
TRAINER_READ_VARS = (TERMINATION_GRACE_SECONDS,)
#: Opt-in, set by a user (extraEnv) or a test: `1` makes every pipeline process walk each of its RPC
#: results as TensorPipe walks them with device maps, and refuse a result that is more than tensors and
#: small plain values (trainer: engines/pipeline/guard.py), so a pipeline that would stop at its first
#: step on a GPU stops the same way on CPU. `0` or unset: off. The test suite turns it on.
DEVICE_MAP_GUARD = "MASKRCNN_DEVICE_MAP_GUARD"

# ---------------------------------------------------------------------------------------------
# Variables the launcher exports to the trainer (besides MASTER_ADDR and MASTER_PORT above).
# ---------------------------------------------------------------------------------------------

#: torchrun-compatible variables; for ddp, `torch.distributed.run` sets them per process itself.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
#: This pod's `PodPlan` as JSON.
POD_PLAN = "MASKRCNN_POD_PLAN"
#: Socket interface names, exported only when the topology names an interface.
TP_SOCKET_IFNAME = "TP_SOCKET_IFNAME"
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
SOCKET_IFNAME_VARS = (TP_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)

#: What a pod spec (the chart, the plain manifests) must set. HOSTNAME is set by the kubelet and
#: the identity flags are for bare nodes, so neither is listed.
POD_ENV_VARS = (TOPOLOGY, POD_NAME, POD_NAMESPACE, POD_IP, HEADLESS_SERVICE, CLUSTER_DOMAIN)
#: Labels and annotations (same keys) the JobSet and Job controllers put on a JobSet's pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: What a JobSet pod spec sets besides POD_ENV_VARS: variable -> the downward-API field it comes from.
JOBSET_FIELDS = {
    JOBSET_NAME: f"metadata.labels['{JOBSET_NAME_LABEL}']",
    REPLICATED_JOB: f"metadata.labels['{REPLICATED_JOB_LABEL}']",
    JOB_INDEX: f"metadata.labels['{JOB_INDEX_LABEL}']",
    COMPLETION_INDEX: f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']",
}
JOBSET_POD_ENV_VARS = tuple(JOBSET_FIELDS)
#: Every variable the launcher reads.
READ_VARS = (
    TOPOLOGY,
    ROLE,
    INDEX,
    POD_NAME,
    HOSTNAME,
    POD_NAMESPACE,
    POD_IP,
    HEADLESS_SERVICE,
    CLUSTER_DOMAIN,
    *JOBSET_POD_ENV_VARS,
    *TORCH_RUNTIME_VARS,
    MASTER_ADDR,
    MASTER_PORT,
    TRAINER_CMD,
    WAIT_TIMEOUT,
)
#: The only MASKRCNN_* variables a user sets in a pod spec (the chart's extraEnv): the contract's two,
#: the error boundary's MASKRCNN_DEBUG (tracebacks, in every process) and the pipeline's device-map
#: guard. The chart refuses every other variable of the contract, which the pod's identity or the
#: launcher own.
USER_ENV_VARS = (TRAINER_CMD, WAIT_TIMEOUT, DEBUG_ENV, DEVICE_MAP_GUARD)
#: Every variable the launcher may export.
EXPORTED_VARS = (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, POD_PLAN) + (
    SOCKET_IFNAME_VARS
)

DEFAULT_CLUSTER_DOMAIN = "cluster.local"
DEFAULT_MASTER_PORT = 29500
DEFAULT_WAIT_TIMEOUT_S = 300.0
