"""The decisions the contract owns once for launcher, trainer and status: placement, pod names, backend,
and the trainer's record. (The progress line is tested with its reader, in test_status_report.py.)"""

from __future__ import annotations

from dataclasses import fields

import pytest
from maskrcnn_launcher import contract
from maskrcnn_launcher.contract import (
    MODULES,
    PodPlan,
    StagePlacement,
    node_rank,
    parse_pod_name,
    placement_problems,
    pod_name,
    process_group_backend,
    validate_placement,
)

GOOD_PLACEMENTS = [
    [list(MODULES)],
    [["transform", "backbone"], ["rpn", "roi_heads"]],
    [["transform", "backbone"], ["rpn"], ["roi_heads"]],
    [["transform", "backbone", "rpn"], ["roi_heads"]],
]


@pytest.mark.parametrize("placement", GOOD_PLACEMENTS, ids=lambda p: "|".join(",".join(s) for s in p))
def test_good_placements(placement: list[list[str]]) -> None:
    assert placement_problems(placement) == []
    assert validate_placement(placement) == tuple(tuple(s) for s in placement)
    assert validate_placement(tuple(tuple(s) for s in placement)) == tuple(tuple(s) for s in placement)


@pytest.mark.parametrize(
    ("placement", "problems"),
    [
        ([], ["no stages: the placement needs at least one"]),
        (
            [["transform"], ["backbone", "rpn", "roi_heads"]],
            [
                "stage 1 holds only transform, which has no parameters to train: put it in one stage with the module "
                + "after it"
            ],
        ),
        ([[], list(MODULES)], ["stage 1 is empty"]),
        (
            [["transform", "backbone"], ["rpn"]],
            ["module 'roi_heads' is placed in no stage"],
        ),
        (
            [["transform", "backbone"], ["backbone", "rpn", "roi_heads"]],
            ["module 'backbone' is placed in 2 stages"],
        ),
        (
            [["transform", "backbone", "backbone"], ["rpn", "roi_heads"]],
            ["module 'backbone' is listed 2 times in stage 1"],
        ),
        (
            [["backbone", "transform"], ["rpn", "roi_heads"]],
            [
                "modules out of order: backbone, transform, rpn, roi_heads; stages must be contiguous runs of "
                "the forward order transform, backbone, rpn, roi_heads"
            ],
        ),
        (  # each stage in order, but not contiguous: the concatenation gives it away
            [["transform", "rpn"], ["backbone", "roi_heads"]],
            [
                "modules out of order: transform, rpn, backbone, roi_heads; stages must be contiguous runs of "
                "the forward order transform, backbone, rpn, roi_heads"
            ],
        ),
        (
            [["transform", "backbon"], ["rpn", "roi_heads"]],
            [
                "unknown module 'backbon' (the modules are transform, backbone, rpn, roi_heads)",
                "module 'backbone' is placed in no stage",
            ],
        ),
        (
            ["transform", ["backbone", "rpn", "roi_heads"]],
            [
                "stage 1 is the string 'transform', not a list of module names",
                "module 'transform' is placed in no stage",
            ],
        ),
    ],
)
def test_placement_problems(placement: list, problems: list[str]) -> None:
    assert placement_problems(placement) == problems
    with pytest.raises(ValueError) as info:
        validate_placement(placement)
    message = str(info.value)
    assert "; ".join(problems) in message
    rule = "(a placement splits transform, backbone, rpn, roi_heads into non-empty contiguous runs, in this order)"
    assert message.endswith(rule)


def test_every_problem_is_reported_at_once() -> None:
    assert placement_problems([[], ["roi_heads", "rpn"]]) == [
        "stage 1 is empty",
        "module 'transform' is placed in no stage",
        "module 'backbone' is placed in no stage",
    ]


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("demo-maskrcnn-dist-master-0", ("demo-maskrcnn-dist", "master", 0)),
        ("a-worker-1-worker-12", ("a-worker-1", "worker", 12)),
        ("demo-maskrcnn-dist-test-master", None),
        ("Demo-master-0", None),
        ("master-0", None),
    ],
)
def test_pod_names_round_trip(name: str, parsed: tuple[str, str, int] | None) -> None:
    assert parse_pod_name(name) == parsed
    if parsed is not None:
        assert pod_name(*parsed) == name


def test_node_rank_and_backend() -> None:
    assert [node_rank("master", 0), node_rank("worker", 0), node_rank("worker", 3)] == [0, 1, 4]
    assert (process_group_backend(uses_gpu=True), process_group_backend(uses_gpu=False)) == ("nccl", "gloo")


def test_the_pod_plan_carries_only_what_the_trainer_reads() -> None:
    """Launcher-only facts (devices, node layout, DNS name, interface, estimates) live in plan.PodLaunch."""
    assert [f.name for f in fields(PodPlan)] == [
        "engine",
        "role",
        "index",
        "rank",
        "world_size",
        "rpc_name",
        "master_addr",
        "master_port",
        "backend",
        "stages",
        "transport",
        "device_maps",
        "version",
    ]
    stage = StagePlacement(1, "stage1", 0, 1, "worker1", ("transform", "backbone"), ("cuda:0", "cuda:1"))
    plan = PodPlan("pipeline", "worker", 0, 1, 3, "worker1", "m", 29500, "nccl", (stage,), "cpu", {})
    assert PodPlan.from_json(plan.to_json()) == plan and stage.replicas == 2
    assert plan.version == contract.PLAN_VERSION


def test_a_stage_without_parameters_is_refused_only_where_stages_train() -> None:
    split = [["transform"], ["backbone", "rpn", "roi_heads"]]
    assert placement_problems(split) and placement_problems(split, trained=False) == []
    assert validate_placement(split, trained=False) == (("transform",), ("backbone", "rpn", "roi_heads"))
