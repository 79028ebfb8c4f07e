"""Kubeflow Trainer v2's torch runtime as the launcher's identity source: the PET_* variables, exactly as
the Torch plugin injects them, give the node, the job's shape and the master; every contradiction with
the topology is one `error:` line and exit 2.

The variables and their formats are kubeflow/trainer v2.3.0's: pkg/constants/constants.go (TorchEnvNumNodes
"PET_NNODES", TorchEnvNumProcPerNode "PET_NPROC_PER_NODE", TorchEnvNodeRank "PET_NODE_RANK", TorchEnvMasterAddr
"PET_MASTER_ADDR", TorchEnvMasterPort "PET_MASTER_PORT", ContainerTrainerPort 29500, Node "node") and
pkg/runtime/framework/plugins/torch/torch.go's EnforceMLPolicy: PET_NNODES `fmt.Sprintf("%d", count)`,
PET_NPROC_PER_NODE `numProcPerNode.String()` ("auto" or a number), PET_NODE_RANK from the downward API
field `metadata.annotations['batch.kubernetes.io/job-completion-index']`, PET_MASTER_ADDR
`fmt.Sprintf("%s-%s-0-0.%s", trainJob.Name, constants.Node, trainJob.Name)`, PET_MASTER_PORT
`fmt.Sprintf("%d", constants.ContainerTrainerPort)`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from maskrcnn_launcher import contract
from maskrcnn_launcher.errors import IdentityError
from maskrcnn_launcher.identity import IdentityInputs, resolve_identity
from maskrcnn_launcher.launch import trainer_command
from maskrcnn_launcher.plan import derive_pod
from maskrcnn_launcher.topology import parse_topology

from .conftest import clean_env

TRAINJOB = "coco"
CPU = parse_topology({"engine": "ddp", "workers": [{"devices": 0}, {"devices": 0}]}, "cpu.yaml")
GPU = parse_topology(
    {"engine": "ddp", "master": {"devices": 2}, "workers": [{"devices": 2}, {"devices": 2}]}, "gpu.yaml"
)


def injected(node: int, nnodes: int = 3, nproc: str = "1", trainjob: str = TRAINJOB) -> dict[str, str]:
    """What a pod of the TrainJob's `node` replicated job holds: the Torch plugin's five variables with the
    completion index resolved by the kubelet, and what the kit's runtime sets (contract.TRAINJOB_POD_ENV_VARS)."""
    return {
        "PET_NNODES": str(nnodes),
        "PET_NPROC_PER_NODE": nproc,
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": f"{trainjob}-node-0-0.{trainjob}",
        "PET_MASTER_PORT": "29500",
        "MASKRCNN_TOPOLOGY": "/etc/maskrcnn/topology.yaml",
        "POD_NAME": f"{trainjob}-node-0-{node}-x7k2p",
        "POD_NAMESPACE": "vision",
        "POD_IP": f"10.0.0.{node + 10}",
        "HOSTNAME": f"{trainjob}-node-0-{node}",
    }


# (case, topology, node, PET_NPROC_PER_NODE) -> role, index, first global rank, world size, nproc per node
DERIVATION = [
    ("cpu-master", CPU, 0, "1", ("master", 0, 0, 3, 1)),
    ("cpu-worker-0", CPU, 1, "1", ("worker", 0, 1, 3, 1)),
    ("cpu-worker-1", CPU, 2, "1", ("worker", 1, 2, 3, 1)),
    ("gpu-master-numproc", GPU, 0, "2", ("master", 0, 0, 6, 2)),
    ("gpu-worker-1-numproc", GPU, 2, "2", ("worker", 1, 4, 6, 2)),
    ("gpu-worker-0-auto", GPU, 1, "auto", ("worker", 0, 2, 6, 2)),
]


@pytest.mark.parametrize(
    ("topology", "node", "nproc", "expected"), [c[1:] for c in DERIVATION], ids=[c[0] for c in DERIVATION]
)
def test_derivation_from_the_torch_plugins_variables(topology, node: int, nproc: str, expected) -> None:
    identity = resolve_identity(IdentityInputs(), injected(node, nproc=nproc), topology)
    pod = derive_pod(topology, identity)
    role, index, rank, world, per_node = expected
    assert (identity.role, identity.index) == (role, index)
    assert (pod.plan.rank, pod.plan.world_size, pod.nproc_per_node, pod.nnodes) == (rank, world, per_node, 3)
    assert identity.source == f"Kubeflow Trainer torch runtime: PET_NODE_RANK={node} of PET_NNODES=3"
    assert (pod.plan.master_addr, pod.plan.master_port) == ("coco-node-0-0.coco", 29500)
    assert pod.dns_name == f"coco-node-0-{node}.coco.vision.svc.cluster.local"
    argv = trainer_command(pod, ["--epochs", "1"], python="python3")
    assert argv[:14] == [
        "python3",
        "-m",
        "maskrcnn_dist.torchrun",
        "--nnodes",
        "3",
        "--node-rank",
        str(node),
        "--nproc-per-node",
        str(per_node),
        "--master-addr",
        "coco-node-0-0.coco",
        "--master-port",
        "29500",
        "-m",
    ]
    assert argv[14:] == ["maskrcnn_dist.cli", "train", "--engine", "ddp", "--epochs", "1"]
    assert pod.exported_env()[contract.MASTER_ADDR] == "coco-node-0-0.coco"


def test_the_contract_names_what_the_plugin_injects() -> None:
    assert contract.TORCH_RUNTIME_VARS == (
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    )
    assert set(contract.TORCH_RUNTIME_VARS) <= set(contract.READ_VARS)
    assert contract.trainjob_master_addr("coco") == "coco-node-0-0.coco"
    assert contract.TRAINER_MASTER_PORT == 29500 and contract.TRAINER_NODE == "node"


def test_explicit_flags_still_win_and_the_shape_is_still_checked() -> None:
    env = injected(2)
    identity = resolve_identity(IdentityInputs(role="worker", index=0, master_addr="10.0.0.10"), env, CPU)
    assert (identity.role, identity.index, identity.master_addr, identity.master_port) == (
        "worker",
        0,
        "10.0.0.10",
        29500,
    )
    with pytest.raises(IdentityError, match="PET_NNODES=4 but cpu.yaml names 3"):
        resolve_identity(IdentityInputs(role="master"), injected(0, nnodes=4), CPU)


# (case, env changes, topology, fragments of each error line, in order)
CONTRADICTIONS = [
    ("nnodes", {"PET_NNODES": "2", "PET_NODE_RANK": "1"}, CPU, [["PET_NNODES=2", "names 3 pod(s)", "numNodes to 3"]]),
    (
        "nproc",
        {"PET_NPROC_PER_NODE": "4"},
        CPU,
        [["PET_NPROC_PER_NODE=4", "1 process(es) per pod", "numProcPerNode to 1"]],
    ),
    ("nproc-gpu", {"PET_NPROC_PER_NODE": "1"}, GPU, [["PET_NPROC_PER_NODE=1", "devices 2", "numProcPerNode to 2"]]),
    (
        "pipeline",
        {},
        parse_topology(
            {
                "engine": "pipeline",
                "workers": [{"devices": 1, "stage": "a"}, {"devices": 1, "stage": "b"}],
                "stages": [
                    {"name": "a", "modules": ["transform", "backbone"]},
                    {"name": "b", "modules": ["rpn", "roi_heads"]},
                ],
            },
            "pipe.yaml",
        ),
        [["engine pipeline does not run under Kubeflow Trainer's torch runtime", "same resourcesPerNode"]],
    ),
    (
        "unequal-devices",
        {"PET_NPROC_PER_NODE": "auto"},
        parse_topology(
            {"engine": "ddp", "master": {"devices": 4}, "workers": [{"devices": 2}, {"devices": 2}]}, "mix.yaml"
        ),
        [["the pods have 2 and 4 devices", "same resourcesPerNode"]],
    ),
    (
        "port",
        {"PET_MASTER_PORT": "29400"},
        CPU,
        [["PET_MASTER_PORT=29400", "network.master_port 29500", "set network.master_port to 29400"]],
    ),
    (
        "two-at-once",
        {"PET_NNODES": "5", "PET_NPROC_PER_NODE": "3"},
        CPU,
        [["PET_NNODES=5", "numNodes to 3"], ["PET_NPROC_PER_NODE=3", "numProcPerNode to 1"]],
    ),
    ("rank-beyond-nodes", {"PET_NODE_RANK": "3"}, CPU, [["PET_NODE_RANK=3 is not below PET_NNODES=3"]]),
    ("elastic-range", {"PET_NNODES": "1:4"}, CPU, [["PET_NNODES: '1:4' is not a whole number", "elastic"]]),
    ("nproc-word", {"PET_NPROC_PER_NODE": "cpu"}, CPU, [["PET_NPROC_PER_NODE: 'cpu' is not a whole number"]]),
    ("port-range", {"PET_MASTER_PORT": "70000"}, CPU, [["PET_MASTER_PORT: 70000 is out of range"]]),
    (
        "one-missing",
        {"PET_MASTER_ADDR": ""},
        CPU,
        [["PET_MASTER_ADDR: not set, while PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_PORT are"]],
    ),
]


@pytest.mark.parametrize(
    ("changes", "topology", "lines"), [c[1:] for c in CONTRADICTIONS], ids=[c[0] for c in CONTRADICTIONS]
)
def test_contradictions_are_one_line_each(changes, topology, lines) -> None:
    with pytest.raises(IdentityError) as caught:
        resolve_identity(IdentityInputs(), {**injected(1), **changes}, topology)
    assert len(caught.value.errors) == len(lines), caught.value.errors
    for error, fragments in zip(caught.value.errors, lines, strict=True):
        assert all(fragment in error for fragment in fragments), error


def _topology_file(tmp_path: Path, doc: str) -> str:
    path = tmp_path / "topology.yaml"
    path.write_text(doc)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("command", [["launch", "--dry-run"], ["validate"], ["plan"]])
def test_a_contradiction_through_the_cli_is_one_error_line(console, tmp_path: Path, command: list[str]) -> None:
    env = {
        **clean_env(),
        **injected(1, nnodes=2),
        "MASKRCNN_TOPOLOGY": _topology_file(tmp_path, "engine: ddp\nworkers: [{devices: 0}, {devices: 0}]\n"),
    }
    result = console("maskrcnn-launch", *command, env=env)
    result.assert_one_error_line(2, "PET_NNODES=2 but topology.yaml names 3 pod(s)", "numNodes to 3")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_pipeline_topology_under_the_torch_runtime_is_refused(console) -> None:
    env = {**clean_env(), **injected(0), "MASKRCNN_TOPOLOGY": "three-machines"}
    result = console("maskrcnn-launch", "launch", "--dry-run", env=env)
    result.assert_one_error_line(2, "three-machines.yaml: engine pipeline does not run under Kubeflow Trainer")


@pytest.mark.slow
def test_launch_plan_and_validate_say_what_they_took_from_each_variable(console, tmp_path: Path) -> None:
    topology = _topology_file(tmp_path, "engine: ddp\nmaster: {devices: 2}\nworkers: [{devices: 2}]\n")
    env = {**clean_env(), **injected(1, nnodes=2, nproc="auto"), "MASKRCNN_TOPOLOGY": topology}
    explained = [
        "Kubeflow Trainer torch runtime (TrainJob coco), from this pod's environment:",
        "  PET_NNODES=2: 2 node(s), the topology's master and 1 worker(s) (torchrun --nnodes 2)",
        "  PET_NODE_RANK=1: this pod is node 1, worker 0 (torchrun --node-rank 1)",
        "  PET_NPROC_PER_NODE=auto: 2 process(es) per node, from the topology's devices (torchrun --nproc-per-node 2)",
        "  PET_MASTER_ADDR=coco-node-0-0.coco, PET_MASTER_PORT=29500: the master "
        "(torchrun --master-addr, --master-port)",
    ]
    dry = console("maskrcnn-launch", "launch", "--dry-run", "--", "--epochs", "1", env=env)
    assert dry.code == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert doc["torch_runtime"] == explained and doc["waits_for"] == "coco-node-0-0.coco:29500"
    assert doc["argv"][doc["argv"].index("--nproc-per-node") + 1] == "2"
    validate = console("maskrcnn-launch", "validate", env=env)
    assert validate.code == 0 and validate.stdout.splitlines()[1:] == explained, validate.stdout + validate.stderr
    plan = console("maskrcnn-launch", "plan", env=env)
    lines = plan.stdout.splitlines()
    assert plan.code == 0 and lines[0].endswith("master coco-node-0-0.coco:29500") and lines[1:6] == explained
    assert "coco-node-0-1.coco.default.svc.cluster.local" in plan.stdout
    as_json = json.loads(console("maskrcnn-launch", "plan", "--json", env=env).stdout)
    assert as_json["derived"] == explained and as_json["world_size"] == 4


@pytest.mark.slow
def test_plan_names_a_trainjobs_nodes_without_the_environment(console) -> None:
    result = console(
        "maskrcnn-launch", "plan", "--topology", "ddp", "--workload", "trainjob", "--prefix", "coco", env=clean_env()
    )
    assert result.code == 0, result.stderr
    assert "master coco-node-0-0.coco.default.svc.cluster.local:29500" in result.stdout
    assert "coco-node-0-2.coco.default.svc.cluster.local" in result.stdout
