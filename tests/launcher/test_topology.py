"""Topology validation: every error names its field, all problems are reported at once."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from click.testing import CliRunner
from maskrcnn_launcher.cli import main
from maskrcnn_launcher.errors import TopologyError
from maskrcnn_launcher.topology import builtin_topologies, load_topology, parse_topology

BASE: dict[str, Any] = {
    "engine": "pipeline",
    "master": {"devices": 0},
    "workers": [
        {"devices": 0, "stage": "stage1", "replicas": 1},
        {"devices": 0, "stage": "stage2", "replicas": 1},
    ],
    "stages": [
        {"name": "stage1", "modules": ["transform", "backbone"]},
        {"name": "stage2", "modules": ["rpn", "roi_heads"]},
    ],
    "network": {"master_port": 29500},
}


def edited(**changes: Any) -> dict[str, Any]:
    """BASE with dotted-path edits, e.g. edited(**{"workers.0.replicas": 3}); value None deletes."""
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        key: Any = int(last) if isinstance(node, list) else last
        if value is None:
            del node[key]
        else:
            node[key] = value
    return data


def errors_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(TopologyError) as info:
        parse_topology(data, "t.yaml")
    return info.value.errors


def test_base_is_valid() -> None:
    topo = parse_topology(BASE, "t.yaml")
    assert topo.world_size == 3 and topo.nnodes == 3
    assert [s.modules for s in topo.stages] == [("transform", "backbone"), ("rpn", "roi_heads")]


@pytest.mark.parametrize("name", builtin_topologies())
def test_packaged_topologies_are_valid(name: str) -> None:
    assert load_topology(name).source == f"{name}.yaml"


def test_packaged_topologies_exist() -> None:
    assert {"three-machines", "three-machines-gpu", "ddp"} <= set(builtin_topologies())


# (case id, topology, expected substring of one error: it must name the field)
ERROR_CASES = [
    (
        "replicas > devices",
        edited(**{"workers.1.devices": 2, "workers.1.replicas": 3}),
        "workers[1].replicas: 3 replicas",
    ),
    (
        "stage placed nowhere",
        edited(**{"workers": [{"devices": 0, "stage": "stage1"}]}),
        "stage 'stage2' is placed on no worker",
    ),
    (
        "stage placed twice",
        edited(**{"workers.1.stage": "stage1"}),
        "stage 'stage1' is placed twice (workers 0, 1)",
    ),
    ("unknown stage on a worker", edited(**{"workers.1.stage": "stage3"}), "workers[1].stage: unknown stage 'stage3'"),
    ("worker without stage", edited(**{"workers.1.stage": None}), "workers[1].stage: missing"),
    (
        "unknown module",
        edited(**{"stages.0.modules": ["transform", "backbon"]}),
        "stages[0].modules: unknown module 'backbon' (did you mean 'backbone'?)",
    ),
    ("module missing", edited(**{"stages.1.modules": ["rpn"]}), "module 'roi_heads' is placed in no stage"),
    (
        "module twice",
        edited(**{"stages.1.modules": ["backbone", "rpn", "roi_heads"]}),
        "module 'backbone' is placed in 2 stages",
    ),
    (
        "modules out of order",
        edited(**{"stages.0.modules": ["transform", "rpn"], "stages.1.modules": ["backbone", "roi_heads"]}),
        "modules out of order: transform, rpn, backbone, roi_heads",
    ),
    ("duplicate stage name", edited(**{"stages.1.name": "stage1"}), "stage name 'stage1' is defined more than once"),
    ("ddp with stages", edited(engine="ddp"), "stages: the ddp engine has no stage placements"),
    (
        "ddp with a worker stage",
        {"engine": "ddp", "workers": [{"devices": 1, "stage": "stage1"}], "master": {"devices": 1}},
        "workers[0].stage: the ddp engine has no stage placements",
    ),
    (
        "ddp mixing GPU and CPU pods",
        {"engine": "ddp", "master": {"devices": 2}, "workers": [{"devices": 0}]},
        "ddp needs every pod with GPUs or every pod without",
    ),
    (
        "port too high",
        edited(**{"network.master_port": 70000}),
        "network.master_port: 70000 is above the maximum 65535",
    ),
    ("port zero", edited(**{"network.master_port": 0}), "network.master_port: 0 is below the minimum 1"),
    (
        "replicas beyond any machine",
        edited(**{"workers.0.replicas": 2**70}),
        "workers[0].replicas: 1180591620717411303424 is above",
    ),
    (
        "devices beyond any machine",
        edited(**{"workers.0.devices": 10**6}),
        "workers[0].devices: 1000000 is above",
    ),
    (
        "image side beyond floats",
        edited(estimate={"image_size": [10**400, 8]}),
        "estimate.image_size: expected [height, width]",
    ),
    (
        "batch beyond any machine",
        edited(estimate={"batch_size": 2**40}),
        "estimate.batch_size: 1099511627776 is above",
    ),
    ("port not a number", edited(**{"network.master_port": "http"}), "network.master_port: expected an integer"),
    ("world size mismatch", edited(world_size=4), "world_size: 4 does not match the roles: 1 master + workers = 3"),
    (
        "ddp world size mismatch",
        {"engine": "ddp", "world_size": 3, "master": {"devices": 2}, "workers": [{"devices": 2}]},
        "world_size: 3 does not match the roles: sum over pods of max(devices, 1) = 4",
    ),
    ("unknown top-level key", edited(stagez=[]), "stagez: unknown key 'stagez' (did you mean 'stages'?)"),
    (
        "unknown worker key (typo)",
        edited(**{"workers.0.replica": 2}),
        "workers[0].replica: unknown key 'replica' (did you mean 'replicas'?)",
    ),
    ("unknown network key", edited(**{"network.iface": "eth0"}), "network.iface: unknown key"),
    ("unknown engine", edited(engine="horovod"), "engine: 'horovod' is not one of pipeline, ddp"),
    ("unknown transport", edited(**{"network.transport": "rdma"}), "network.transport: 'rdma' is not one of"),
    ("negative devices", edited(**{"workers.0.devices": -1}), "workers[0].devices: -1 is below the minimum 0"),
    ("zero replicas", edited(**{"workers.0.replicas": 0}), "workers[0].replicas: 0 is below the minimum 1"),
    ("pipeline master with GPUs", edited(**{"master.devices": 1}), "master.devices: must be 0 for the pipeline engine"),
    (
        "device maps without any GPU",
        edited(**{"network.transport": "device_maps"}),
        "network.transport: device_maps needs GPUs: no worker has devices > 0",
    ),
    (
        "micro-batches above batch size",
        edited(estimate={"batch_size": 2, "micro_batches": 4}),
        "estimate.micro_batches: 4 micro-batches for a batch of 2 images",
    ),
    ("bad feature dtype", edited(estimate={"feature_dtype": "fp8"}), "estimate.feature_dtype: 'fp8' is not one of"),
    ("bad image size", edited(estimate={"image_size": [800]}), "estimate.image_size: expected [height, width]"),
]


@pytest.mark.parametrize("data,expected", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_validation_error(data: dict[str, Any], expected: str) -> None:
    errors = errors_of(data)
    assert any(expected in e for e in errors), errors
    assert all(e.startswith("t.yaml: ") for e in errors)


def test_all_errors_are_collected() -> None:
    data = edited(
        world_size=5,
        **{"network.master_port": 99999, "workers.0.replica": 2, "stages.0.modules": ["transform", "backbon"]},
    )
    errors = errors_of(data)
    for field in ("world_size", "network.master_port", "workers[0].replica", "stages[0].modules"):
        assert any(f": {field}: " in e for e in errors), (field, errors)


def test_cpu_replicas_need_no_devices() -> None:
    """A worker without GPUs may hold several CPU replicas (replica averaging on a laptop)."""
    topo = parse_topology(edited(**{"workers.1.replicas": 2}), "t.yaml")
    assert topo.workers[1].replicas == 2


def test_ddp_world_size_counts_processes() -> None:
    topo = parse_topology({"engine": "ddp", "master": {"devices": 4}, "workers": [{"devices": 2}]}, "d.yaml")
    assert topo.world_size == 6 and topo.nnodes == 2


def test_cli_prints_every_error_and_exits_2(tmp_path: Any) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("engine: pipeline\nworld_size: 9\nnetwork: {master_port: 0}\nworkers: []\nstages: []\n")
    for command in ("plan", "validate"):
        result = CliRunner().invoke(main, [command, "--topology", str(path)])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.startswith("error: bad.yaml: ")]
        assert len(lines) >= 3, result.output
        assert "Traceback" not in result.output


def test_missing_file_and_bad_yaml(tmp_path: Any) -> None:
    with pytest.raises(TopologyError, match="neither a file nor a packaged topology"):
        load_topology(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine: [unclosed\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(str(bad))
