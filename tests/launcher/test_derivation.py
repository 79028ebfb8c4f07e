"""Derivation, table-driven: ranks, backends, placement, device maps pair by pair, ddp, commands, env.

Device maps are checked on paper here because users cannot check them by hand: the CALLER's map
names the callee (caller device -> callee device). In the pipeline every tensor travels in a call's
arguments: stage 1 calls stage 2 with the activations, stage 2 calls stage 1 with their gradients, so
each GPU edge has two maps, one in each worker's options.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import PodPlan, process_group_backend
from maskrcnn_launcher.devicemaps import check_one_to_one, inverse
from maskrcnn_launcher.errors import PlanFormatError, TopologyError
from maskrcnn_launcher.estimate import feature_values, padded_size
from maskrcnn_launcher.launch import launch, must_wait, parse_trainer_cmd, trainer_command
from maskrcnn_launcher.peers import WaitPolicy
from maskrcnn_launcher.plan import JobPlan, derive_job
from maskrcnn_launcher.topology import Topology, load_topology, parse_topology


def pipeline(
    devices: tuple[int, int], replicas: tuple[int, int], transport: str = "auto", interface: str | None = None
) -> Topology:
    return parse_topology(
        {
            "engine": "pipeline",
            "workers": [
                {"devices": devices[0], "stage": "stage1", "replicas": replicas[0]},
                {"devices": devices[1], "stage": "stage2", "replicas": replicas[1]},
            ],
            "stages": [
                {"name": "stage1", "modules": ["transform", "backbone"]},
                {"name": "stage2", "modules": ["rpn", "roi_heads"]},
            ],
            "network": {"transport": transport, "interface": interface},
        },
        "case.yaml",
    )


def job_of(topology: Topology) -> JobPlan:
    return derive_job(topology, "master.example", 29500)


@dataclass(frozen=True)
class PipelineCase:
    id: str
    devices: tuple[int, int]
    replicas: tuple[int, int]
    transport: str
    stage_devices: tuple[tuple[str, ...], tuple[str, ...]]
    backends: tuple[str, str, str]  # master, worker1, worker2
    identity: int  # replicas mapped one to one in each direction (0: no map at all)


CUDA = [f"cuda:{i}" for i in range(4)]

PIPELINE_CASES = [
    PipelineCase("cpu", (0, 0), (1, 1), "cpu", (("cpu",), ("cpu",)), ("gloo", "gloo", "gloo"), 0),
    PipelineCase("cpu, auto", (0, 0), (1, 1), "auto", (("cpu",), ("cpu",)), ("gloo", "gloo", "gloo"), 0),
    PipelineCase("cpu replicas", (0, 0), (1, 2), "cpu", (("cpu",), ("cpu", "cpu")), ("gloo",) * 3, 0),
    PipelineCase(
        "1+1 gpu, cpu staging", (1, 1), (1, 1), "cpu", (("cuda:0",), ("cuda:0",)), ("gloo", "nccl", "nccl"), 0
    ),
    PipelineCase("1+1 gpu", (1, 1), (1, 1), "device_maps", (("cuda:0",), ("cuda:0",)), ("gloo", "nccl", "nccl"), 1),
    PipelineCase("1+1 gpu, auto", (1, 1), (1, 1), "auto", (("cuda:0",), ("cuda:0",)), ("gloo", "nccl", "nccl"), 1),
    PipelineCase("2+2 gpu", (2, 2), (2, 2), "device_maps", (tuple(CUDA[:2]),) * 2, ("gloo", "nccl", "nccl"), 2),
    PipelineCase("4+4 gpu", (4, 4), (4, 4), "auto", (tuple(CUDA),) * 2, ("gloo", "nccl", "nccl"), 4),
    PipelineCase(
        "uneven 1+2 (the gpu example)",
        (1, 2),
        (1, 2),
        "device_maps",
        (("cuda:0",), tuple(CUDA[:2])),
        ("gloo", "nccl", "nccl"),
        1,
    ),
    PipelineCase(
        "uneven 2+4, 1+3 replicas", (2, 4), (1, 3), "auto", (("cuda:0",), tuple(CUDA[:3])), ("gloo", "nccl", "nccl"), 1
    ),
    PipelineCase(
        "2 replicas before 1",
        (2, 1),
        (2, 1),
        "device_maps",
        (tuple(CUDA[:2]), ("cuda:0",)),
        ("gloo", "nccl", "nccl"),
        1,
    ),
    PipelineCase(
        "4 gpus, 2 replicas each", (4, 4), (2, 2), "device_maps", (tuple(CUDA[:2]),) * 2, ("gloo", "nccl", "nccl"), 2
    ),
    PipelineCase(
        "gpu stage1, cpu stage2: no map",
        (1, 0),
        (1, 1),
        "device_maps",
        (("cuda:0",), ("cpu",)),
        ("gloo", "nccl", "gloo"),
        0,
    ),
    PipelineCase(
        "cpu stage1, gpu stage2: no map",
        (0, 2),
        (2, 2),
        "auto",
        (("cpu", "cpu"), tuple(CUDA[:2])),
        ("gloo", "gloo", "nccl"),
        0,
    ),
]


@pytest.mark.parametrize("case", PIPELINE_CASES, ids=[c.id for c in PIPELINE_CASES])
def test_pipeline_derivation(case: PipelineCase) -> None:
    job = job_of(pipeline(case.devices, case.replicas, case.transport))
    master_pod, w1_pod, w2_pod = job.launches
    master, w1, w2 = job.pods
    assert (master, w1, w2) == (master_pod.plan, w1_pod.plan, w2_pod.plan)

    # Identity: ranks, names, world.
    assert [(p.plan.role, p.plan.index, p.plan.rank, p.plan.rpc_name, p.node_rank) for p in job.launches] == [
        ("master", 0, 0, "master", 0),
        ("worker", 0, 1, "worker1", 1),
        ("worker", 1, 2, "worker2", 2),
    ]
    assert {(p.plan.world_size, p.nnodes, p.nproc_per_node) for p in job.launches} == {(3, 3, 1)}
    assert {(p.master_addr, p.master_port) for p in job.pods} == {("master.example", 29500)}
    assert (master.backend, w1.backend, w2.backend) == case.backends
    assert [p.plan.backend for p in job.launches] == [process_group_backend(p.devices > 0) for p in job.launches]

    # Placement: global, and each pod's own (derived from the global one).
    assert [(s.rpc_name, s.rank, s.modules, s.devices) for s in master.stages] == [
        ("worker1", 1, ("transform", "backbone"), case.stage_devices[0]),
        ("worker2", 2, ("rpn", "roi_heads"), case.stage_devices[1]),
    ]
    assert all(p.stages == master.stages for p in job.pods)
    assert (master_pod.stage, master_pod.modules, master_pod.replicas) == (None, (), ())
    assert (w1_pod.stage, w1_pod.modules, w1_pod.replicas) == (1, ("transform", "backbone"), case.stage_devices[0])
    assert (w2_pod.stage, w2_pod.modules, w2_pod.replicas) == (2, ("rpn", "roi_heads"), case.stage_devices[1])

    # Device maps, pair by pair. The master is CPU-only: it calls both workers without maps, and every
    # answer it gets holds CPU tensors. Worker1 calls worker2 with activations, worker2 calls worker1 with
    # their gradients: each sets the map of its own calls, replica r to replica r over the replicas both have.
    assert master.device_maps == {}
    identity = {CUDA[r]: CUDA[r] for r in range(case.identity)}
    assert w1.device_maps == ({"worker2": identity} if identity else {})
    assert w2.device_maps == ({"worker1": identity} if identity else {})
    # "auto" tells the pods what it resolved to: device maps where some edge joins two GPU stages.
    resolved = case.transport if case.transport != "auto" else ("device_maps" if identity else "cpu")
    assert {p.transport for p in job.pods} == {resolved}
    for caller, callee in ((w1_pod, w2_pod), (w2_pod, w1_pod)):
        for mapping in caller.plan.device_maps.values():
            assert set(mapping) <= set(caller.replicas) and set(mapping.values()) <= set(callee.replicas)
            assert len(set(mapping.values())) == len(mapping)  # one-to-one, as TensorPipe requires
            assert inverse(mapping) == mapping  # the answers (CPU tensors here) would come back the same way


def test_the_gpu_example_maps_both_directions() -> None:
    """worker1 (stage 1, 1 replica) sends worker2 (stage 2, 2 replicas) its activations; worker2 sends back
    their gradients, its replica 1 through its cuda:0 (the map covers one replica of each)."""
    job = job_of(load_topology("three-machines-gpu"))
    w1, w2_pod = job.pod("worker", 0), job.launch("worker", 1)
    w2 = w2_pod.plan
    assert w1.device_maps == {"worker2": {"cuda:0": "cuda:0"}}  # caller worker1's cuda:0 -> callee's cuda:0
    assert w2.device_maps == {"worker1": {"cuda:0": "cuda:0"}}
    assert w2_pod.replicas == ("cuda:0", "cuda:1") and w2.backend == "nccl" and w2_pod.socket_ifname == "eth0"


def test_three_stage_pipeline_maps_each_adjacent_pair() -> None:
    topo = parse_topology(
        {
            "engine": "pipeline",
            "workers": [
                {"devices": 1, "stage": "a"},
                {"devices": 2, "stage": "b", "replicas": 2},
                {"devices": 2, "stage": "c", "replicas": 2},
            ],
            "stages": [
                {"name": "a", "modules": ["transform", "backbone"]},
                {"name": "b", "modules": ["rpn"]},
                {"name": "c", "modules": ["roi_heads"]},
            ],
        }
    )
    job = job_of(topo)
    both = {"cuda:0": "cuda:0", "cuda:1": "cuda:1"}
    assert [p.device_maps for p in job.pods] == [
        {},
        {"worker2": {"cuda:0": "cuda:0"}},
        {"worker1": {"cuda:0": "cuda:0"}, "worker3": both},
        {"worker2": both},
    ]
    assert job.pods[0].world_size == 4 and {p.transport for p in job.pods} == {"device_maps"}
    carries = [(link.src, link.dst, link.carries) for link in job.links]
    assert ("worker1", "worker2", "features + targets") in carries
    assert ("worker2", "worker3", "features + proposals + targets") in carries
    assert ("worker3", "worker2", "feature gradients") in carries  # every stage trains: gradients flow back
    assert ("worker3", "master", "losses") in carries and not any(src == "master" for src, _, _ in carries[1:])


def test_non_injective_map_is_refused() -> None:
    with pytest.raises(TopologyError, match="not one-to-one: cuda:0, cuda:1 all map to cuda:0"):
        check_one_to_one({"cuda:0": "cuda:0", "cuda:1": "cuda:0"}, "device map worker2 -> worker1")
    with pytest.raises(TopologyError, match="'cpu' is not a CUDA device"):
        check_one_to_one({"cpu": "cuda:0"}, "device map")


def test_every_sender_replica_has_a_covered_device_of_its_worker() -> None:
    """Whatever the replica counts, the maps of both directions cover at least one replica device of the
    sender (the trainer sends an uncovered replica's tensors through it) and never two onto one device."""
    for a, b in ((1, 4), (4, 1), (3, 2), (2, 3)):
        job = job_of(pipeline((4, 4), (a, b), "auto"))
        for pod, mine in ((job.launch("worker", 0), a), (job.launch("worker", 1), b)):
            (mapping,) = pod.plan.device_maps.values()
            assert len(mapping) == min(a, b) and len(set(mapping.values())) == len(mapping), (a, b)
            assert set(mapping) <= set(pod.replicas) and len(pod.replicas) == mine


@dataclass(frozen=True)
class DdpCase:
    id: str
    devices: tuple[int, ...]  # master, workers...
    ranks: tuple[int, ...]
    nproc: tuple[int, ...]
    world: int
    backend: str


DDP_CASES = [
    DdpCase("cpu", (0, 0, 0), (0, 1, 2), (1, 1, 1), 3, "gloo"),
    DdpCase("1 gpu each", (1, 1, 1), (0, 1, 2), (1, 1, 1), 3, "nccl"),
    DdpCase("2 gpus each", (2, 2), (0, 2), (2, 2), 4, "nccl"),
    DdpCase("4 gpus each", (4, 4, 4), (0, 4, 8), (4, 4, 4), 12, "nccl"),
    DdpCase("uneven", (2, 4, 1), (0, 2, 6), (2, 4, 1), 7, "nccl"),
    DdpCase("single node", (8,), (0,), (8,), 8, "nccl"),
]


@pytest.mark.parametrize("case", DDP_CASES, ids=[c.id for c in DDP_CASES])
def test_ddp_derivation(case: DdpCase) -> None:
    topo = parse_topology(
        {"engine": "ddp", "master": {"devices": case.devices[0]}, "workers": [{"devices": d} for d in case.devices[1:]]}
    )
    job = job_of(topo)
    assert tuple(p.rank for p in job.pods) == case.ranks
    assert tuple(p.nproc_per_node for p in job.launches) == case.nproc
    assert tuple(p.node_rank for p in job.launches) == tuple(range(len(case.devices)))
    assert {(p.plan.world_size, p.nnodes, p.plan.backend) for p in job.launches} == {
        (case.world, len(case.devices), case.backend)
    }
    assert all(p.plan.stages == () and p.plan.device_maps == {} and p.stage is None for p in job.launches)
    if case.world > 1:
        assert all(link.dst == "ring" and link.bytes_per_step > 0 for link in job.links)


def test_ddp_trainer_command_uses_torchrun() -> None:
    job = job_of(load_topology("ddp"))
    pod = job.launch("worker", 1)
    argv = trainer_command(pod, ["--epochs", "2"], python="/venv/bin/python")
    assert argv == [
        "/venv/bin/python",
        "-m",
        "maskrcnn_dist.torchrun",
        "--nnodes",
        "3",
        "--node-rank",
        "2",
        "--nproc-per-node",
        "4",
        "--master-addr",
        "master.example",
        "--master-port",
        "29500",
        "-m",
        "maskrcnn_dist.cli",
        "train",
        "--engine",
        "ddp",
        "--epochs",
        "2",
    ]
    custom = trainer_command(pod, ["x"], ["my-trainer", "--flag"], python="py")
    assert custom[-4:] == ["--no-python", "my-trainer", "--flag", "x"]


def test_pipeline_trainer_command_and_override() -> None:
    pod = job_of(pipeline((0, 0), (1, 1))).launch("worker", 0)
    assert trainer_command(pod, ["--steps", "2"], python="py") == [
        "py",
        "-m",
        "maskrcnn_dist.cli",
        "train",
        "--engine",
        "pipeline",
        "--steps",
        "2",
    ]
    assert trainer_command(pod, ["a"], ["python", "-c", "print(1)"]) == ["python", "-c", "print(1)", "a"]
    assert parse_trainer_cmd(None, {contract.TRAINER_CMD: "python -c 'print(1)'"}) == ["python", "-c", "print(1)"]
    assert parse_trainer_cmd("flag wins", {contract.TRAINER_CMD: "env"}) == ["flag", "wins"]
    assert parse_trainer_cmd(None, {}) is None


@pytest.mark.parametrize("interface", [None, "eth1"])
def test_exported_environment(interface: str | None) -> None:
    pod = job_of(pipeline((0, 0), (1, 1), interface=interface)).launch("worker", 1)
    env = pod.exported_env()
    assert env == contract.exported_env(pod.plan, interface)
    assert {
        k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    } == {
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "master.example",
        "MASTER_PORT": "29500",
    }
    assert PodPlan.from_env(env) == pod.plan
    ifnames = {k: env.get(k) for k in contract.SOCKET_IFNAME_VARS}
    assert ifnames == {k: interface for k in contract.SOCKET_IFNAME_VARS}
    assert set(env) <= set(contract.EXPORTED_VARS)


def test_ddp_exports_no_per_process_variables() -> None:
    env = job_of(load_topology("ddp")).launch("master", 0).exported_env()
    assert "RANK" not in env and "WORLD_SIZE" not in env  # torch.distributed.run sets them per process
    assert env["TP_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"


@pytest.mark.parametrize("name", ["three-machines", "three-machines-gpu", "ddp"])
def test_pod_plan_json_round_trip(name: str) -> None:
    for pod in job_of(load_topology(name)).pods:
        assert PodPlan.from_json(pod.to_json()) == pod
        assert json.loads(pod.to_json())["version"] == contract.PLAN_VERSION


@pytest.mark.parametrize(
    "env,message",
    [
        ({}, "MASKRCNN_POD_PLAN is not set"),
        ({contract.POD_PLAN: "{"}, "not JSON"),
        ({contract.POD_PLAN: "[]"}, "expected a JSON object"),
        ({contract.POD_PLAN: '{"surprise": 1}'}, "unknown fields ['surprise']"),
        ({contract.POD_PLAN: '{"engine": "ddp"}'}, "malformed plan record"),
        ({contract.POD_PLAN: '{"version": 1, "devices": 0}'}, "version 1, expected 2"),
        # A launcher-only field is not part of the trainer's record.
        ({contract.POD_PLAN: '{"nnodes": 3}'}, "unknown fields ['nnodes']"),
    ],
)
def test_pod_plan_from_env_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(PlanFormatError) as info:
        PodPlan.from_env(env)
    assert message in str(info.value)


def test_contract_names_are_unique_and_cover_the_docs() -> None:
    assert len(set(contract.READ_VARS)) == len(contract.READ_VARS)
    assert set(contract.POD_ENV_VARS) <= set(contract.READ_VARS)
    documented = {"MASKRCNN_TOPOLOGY", "MASKRCNN_ROLE", "MASKRCNN_INDEX", "POD_NAME", "HOSTNAME", "POD_NAMESPACE"}
    documented |= {"POD_IP", "MASKRCNN_HEADLESS_SERVICE", "MASKRCNN_CLUSTER_DOMAIN", "MASTER_ADDR", "MASTER_PORT"}
    assert documented <= set(contract.READ_VARS)


def test_feature_estimate_formula() -> None:
    topo = pipeline((0, 0), (1, 1))
    assert padded_size(topo.estimate) == (800, 1344)
    # 200x336 + 100x168 + 50x84 + 25x42 + pool 13x21, 256 channels.
    assert feature_values(topo.estimate) == 256 * (67200 + 16800 + 4200 + 1050 + 273)
    fwd = next(link for link in job_of(topo).links if link.carries == "feature gradients")
    assert fwd.bytes_per_step == 2 * 4 * 256 * 89523 and fwd.messages_per_step == 2


def test_bf16_halves_feature_bytes() -> None:
    def grads(dtype: str) -> int:
        data: dict[str, Any] = {
            "workers": [{"stage": "s1"}, {"stage": "s2"}],
            "stages": [
                {"name": "s1", "modules": ["transform", "backbone"]},
                {"name": "s2", "modules": ["rpn", "roi_heads"]},
            ],
            "estimate": {"feature_dtype": dtype},
        }
        links = job_of(parse_topology(data)).links
        return next(link.bytes_per_step for link in links if link.carries == "feature gradients")

    assert grads("bfloat16") * 2 == grads("float32")


def test_master_does_not_wait_for_its_own_port() -> None:
    """rank 0 hosts the store on MASTER_PORT: waiting for it would deadlock. Nothing listens here."""
    job = derive_job(pipeline((0, 0), (1, 1)), "127.0.0.1", 1)
    calls: list[Any] = []
    master = job.launch("master", 0)
    assert not must_wait(master) and must_wait(job.launch("worker", 0))
    launch(
        master, ["--x"], ["stand-in"], WaitPolicy(timeout_s=0.1), {"KEEP": "1"}, lambda _: None, execvpe=_record(calls)
    )
    (file, argv, env), *_ = calls
    assert (file, argv) == ("stand-in", ["stand-in", "--x"])
    assert env["KEEP"] == "1" and env["RANK"] == "0" and PodPlan.from_env(env) == master.plan


def _record(calls: list[Any]) -> Any:
    def fake_exec(file: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((file, argv, env))

    return fake_exec


def test_ranks_sharing_a_gpu_use_gloo() -> None:
    """nccl refuses two ranks on one device: a 2-process ddp run on a one-GPU machine gets gloo."""
    assert process_group_backend(uses_gpu=True) == "nccl"
    assert process_group_backend(uses_gpu=True, shares_gpu=True) == "gloo"
    assert process_group_backend(uses_gpu=False, shares_gpu=True) == "gloo"
