"""The topology ConfigMap the launcher reads: GPU limits equal its device counts, the chart refuses
exactly the pipelines the launcher refuses, and `estimate` feeds only the printed plan.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml
from maskrcnn_launcher import contract
from maskrcnn_launcher.topology import parse_topology

from .conftest import load_manifests
from .objects import CASE_IDS, CASES, pod_templates, topology_of, topology_text, trainer

pytestmark = pytest.mark.needs_helm


@pytest.mark.parametrize(("scenario", "jobset_api"), CASES, ids=CASE_IDS)
def test_gpu_limits_equal_the_topology_device_counts(render, values, scenario: str, jobset_api: bool) -> None:
    objects = render(scenario, jobset_api=jobset_api)
    topology = topology_of(objects)
    templates = pod_templates(objects)
    gpu = values(scenario)["gpuResourceName"]

    def limit(role: str) -> int:
        resources = trainer(templates[role]).get("resources", {})
        assert gpu not in resources.get("requests", {}), "extended resources: set the limit only"
        return int(resources.get("limits", {}).get(gpu, 0))

    assert limit("master") == topology.master_devices
    # One pod template for every worker: all workers have the same device count, equal to the limit.
    assert {w.devices for w in topology.workers} <= {limit("worker")}
    if topology.master_devices == 0:
        assert gpu not in trainer(templates["master"]).get("resources", {}).get("limits", {}), "CPU: no GPU limit"


def test_gpu_scenario_renders_gpu_limits(render) -> None:
    topology = topology_of(render("gpu-3-machines"))
    assert topology.engine == "pipeline" and [w.devices for w in topology.workers] == [2, 2]
    assert [w.replicas for w in topology.workers] == [2, 2]
    ddp = topology_of(render("ddp"))
    assert ddp.engine == "ddp" and ddp.node_devices() == [2, 2, 2] and ddp.world_size == 6


@pytest.mark.parametrize("jobset_api", [False, True])
def test_estimate_changes_only_the_printed_plan(render, jobset_api: bool) -> None:
    """The topology ConfigMap carries estimate (for `maskrcnn-launch plan`); nothing else changes, so
    a changed estimate restarts no pod."""
    with_estimate = render("gpu-3-machines", jobset_api=jobset_api)
    without = render("gpu-3-machines", "estimate=null", jobset_api=jobset_api)
    assert topology_of(with_estimate).estimate != topology_of(without).estimate
    differ = [o["kind"] for o, p in zip(with_estimate, without, strict=True) if o != p]
    assert differ == ["ConfigMap"], differ
    assert with_estimate != without


# (trainer.args, estimate) -> the topology's estimate: batch_size and micro_batches come from the
# trainer's flags when estimate leaves them out, in every spelling; the last flag given wins.
BF16 = {"feature_dtype": "bfloat16"}
ESTIMATES = [
    (["--batch-size", "8", "--micro-batches", "4"], None, {"batch_size": 8, "micro_batches": 4}),
    (["--batch-size=6"], {}, {"batch_size": 6}),
    (["--micro-batches=2", "--amp", "--batch-size", "4"], None, {"batch_size": 4, "micro_batches": 2}),
    (["--batch-size", "{{ add 4 4 }}"], None, {"batch_size": 8}),
    (
        ["--batch-size", "8"],
        {"batch_size": 8, "feature_dtype": "bfloat16"},
        {"batch_size": 8, "feature_dtype": "bfloat16"},
    ),
    (["--resume", "auto"], {"batch_size": 4, "micro_batches": 4}, {"batch_size": 4, "micro_batches": 4}),
    (["--resume", "auto"], None, None),
]


@pytest.mark.parametrize(("args", "estimate", "expected"), ESTIMATES)
def test_estimate_takes_the_batch_and_micro_batches_from_trainer_args(
    template_values, args: list[str], estimate: dict[str, Any] | None, expected: dict[str, Any] | None
) -> None:
    values: dict[str, Any] = {"trainer": {"args": args}}
    if estimate is not None:
        values["estimate"] = estimate
    proc = template_values(values)
    assert proc.returncode == 0, proc.stderr
    objects = load_manifests(proc.stdout)
    assert yaml.safe_load(topology_text(objects)).get("estimate") == expected
    topology_of(objects)  # the launcher takes it


def test_a_values_file_states_the_batch_once(render, values) -> None:
    """ci/gpu-3-machines-values.yaml gives --batch-size 8 and --micro-batches 4 in trainer.args only;
    the plan's estimate says the same."""
    assert not {"batch_size", "micro_batches"} & set(values("gpu-3-machines")["estimate"])
    estimate = topology_of(render("gpu-3-machines")).estimate
    assert (estimate.batch_size, estimate.micro_batches) == (8, 4)


# (trainer.args, estimate, the message): an estimate that says otherwise than trainer.args, a flag value
# that is no count, and micro-batches the launcher refuses, wherever they come from.
CONTRADICTIONS = [
    (
        ["--batch-size", "8"],
        {"batch_size": 4},
        "estimate.batch_size (4) contradicts trainer.args --batch-size 8: estimate describes the run",
    ),
    (
        ["--batch-size", "8", "--micro-batches=4"],
        {"micro_batches": 2},
        "estimate.micro_batches (2) contradicts trainer.args --micro-batches 4",
    ),
    (["--batch-size", "2", "--batch-size=6"], {"batch_size": 2}, "estimate.batch_size (2) contradicts"),
    (["--batch-size", "eight"], None, "trainer.args: --batch-size eight is not a positive whole number"),
    (["--micro-batches=0"], None, "trainer.args: --micro-batches 0 is not a positive whole number"),
    (
        ["--batch-size", "2", "--micro-batches", "4"],
        None,
        "trainer.args --micro-batches (4) exceeds trainer.args --batch-size (2)",
    ),
    (["--batch-size", "2"], {"micro_batches": 3}, "estimate.micro_batches (3) exceeds trainer.args --batch-size (2)"),
]


@pytest.mark.parametrize(("args", "estimate", "message"), CONTRADICTIONS)
def test_an_estimate_that_contradicts_trainer_args_is_refused(
    template_values, args: list[str], estimate: dict[str, Any] | None, message: str
) -> None:
    values: dict[str, Any] = {"trainer": {"args": args}}
    if estimate is not None:
        values["estimate"] = estimate
    proc = template_values(values)
    assert proc.returncode != 0, f"{args} with estimate {estimate} was accepted"
    assert message in proc.stderr, proc.stderr


def contiguous_splits(modules: tuple[str, ...]) -> list[list[list[str]]]:
    """Every split of `modules` into non-empty contiguous runs, in order."""
    n = len(modules)
    cut_sets = [cuts for k in range(n) for cuts in itertools.combinations(range(1, n), k)]
    return [[list(modules[a:b]) for a, b in itertools.pairwise((0, *cuts, n))] for cuts in cut_sets]


TWO_STAGES = [["transform", "backbone"], ["rpn", "roi_heads"]]
THREE_STAGES = [["transform", "backbone"], ["rpn"], ["roi_heads"]]
# (placement, worker.gpus, pipeline.transport, replicas per stage, stage names): every contiguous split
# on CPU, placements that are not such a split, and replica counts against the GPUs and device maps.
PIPELINES = [
    *[(split, 0, "cpu", None, None) for split in contiguous_splits(contract.MODULES)],
    ([["rpn", "roi_heads"], ["transform", "backbone"]], 0, "cpu", None, None),
    ([["transform", "backbone"], ["rpn"]], 0, "cpu", None, None),
    ([["transform", "backbone", "rpn"], ["rpn", "roi_heads"]], 0, "cpu", None, None),
    ([["transform", "rpn"], ["backbone", "roi_heads"]], 0, "cpu", None, None),
    ([["backbone", "transform"], ["rpn", "roi_heads"]], 0, "cpu", None, None),
    (TWO_STAGES, 0, "cpu", [3, 1], None),
    (TWO_STAGES, 1, "cpu", [2, 1], None),
    (TWO_STAGES, 2, "cpu", [2, 1], None),
    (TWO_STAGES, 2, "device_maps", [2, 1], None),
    (TWO_STAGES, 2, "auto", [2, 1], None),
    (TWO_STAGES, 0, "auto", None, None),
    (TWO_STAGES, 2, "device_maps", [1, 2], None),
    (THREE_STAGES, 4, "device_maps", [1, 4, 2], None),
    (THREE_STAGES, 4, "device_maps", [2, 2, 4], None),
    (TWO_STAGES, 0, "cpu", None, ["same", "same"]),
]


def chart_pipeline(placement: list[list[str]], replicas: list[int] | None, names: list[str] | None) -> dict[str, Any]:
    stages = [{"name": f"stage{i + 1}", "modules": modules} for i, modules in enumerate(placement)]
    for i, stage in enumerate(stages):
        if replicas:
            stage["replicas"] = replicas[i]
        if names:
            stage["name"] = names[i]
    return {"stages": stages}


def launcher_topology(values: dict[str, Any]) -> dict[str, Any]:
    """The topology a pipeline's values stand for (the launcher's format), as the chart renders it."""
    stages, gpus = values["pipeline"]["stages"], values["worker"]["gpus"]
    return {
        "engine": "pipeline",
        "master": {"devices": 0},
        "workers": [{"devices": gpus, "stage": s["name"], "replicas": s.get("replicas", 1)} for s in stages],
        "stages": [{"name": s["name"], "modules": s["modules"]} for s in stages],
        "network": {"master_port": 29500, "transport": values["pipeline"]["transport"]},
    }


@pytest.mark.parametrize(("placement", "gpus", "transport", "replicas", "names"), PIPELINES)
def test_the_chart_refuses_the_pipelines_the_launcher_refuses(
    template_values, placement, gpus: int, transport: str, replicas, names
) -> None:
    """A topology the launcher refuses makes every pod exit 2 at start-up (a JobSet fails at once, a
    StatefulSet crash-loops): the chart refuses the same values when it is rendered, naming them, and
    renders the others into the topology the launcher takes."""
    from maskrcnn_launcher.errors import TopologyError

    values = {
        "pipeline": {**chart_pipeline(placement, replicas, names), "transport": transport},
        "worker": {"gpus": gpus},
    }
    expected = launcher_topology(values)
    try:
        parse_topology(expected, "values")
        problem = None
    except TopologyError as exc:
        problem = str(exc)
    proc = template_values(values)
    if problem:
        assert proc.returncode != 0, f"the chart renders a topology the launcher refuses: {problem}"
        assert "pipeline.stages" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, f"the chart refuses a topology the launcher takes:\n{proc.stderr}"
    assert yaml.safe_load(topology_text(load_manifests(proc.stdout))) == expected
