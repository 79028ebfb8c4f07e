"""The cost model on synthetic measurements: no torch work, only arithmetic the ranking rests on."""

from __future__ import annotations

from dataclasses import replace

import pytest
from maskrcnn_launcher.topology import parse_topology

from maskrcnn_dist.profile.candidates import Candidate, candidates, contiguous_splits
from maskrcnn_dist.profile.cost_model import Setting, predict
from maskrcnn_dist.profile.measure import CutCost, Measurements, ModuleCost
from maskrcnn_dist.profile.recommend import rank, recommended, why

MB = 1_000_000


def measurements(backbone: float, rpn: float, roi_heads: float, feature_mb: float = 3.0) -> Measurements:
    """One image per micro-batch; forward = backward = half of each module's time."""

    def module(name: str, seconds: float, params_mb: float) -> ModuleCost:
        return ModuleCost(name, seconds / 2, seconds / 2, 0.0, int(params_mb * MB), int(params_mb * MB), 10 * MB)

    features = int(feature_mb * MB)
    return Measurements(
        device="cpu: test",
        device_type="cpu",
        threads=1,
        micro_batch_images=1,
        image_size=(128, 128),
        instances_per_image=3,
        modules=(
            module("transform", 0.0, 0.0),
            module("backbone", backbone, 50.0),
            module("rpn", rpn, 2.0),
            module("roi_heads", roi_heads, 60.0),
        ),
        cuts=(
            CutCost("input", MB, 0),
            CutCost("transform", MB, 0),
            CutCost("backbone", features, features),
            CutCost("rpn", features, features),
        ),
    )


SETTING = Setting(batch=4, micro_batches=4, link_gbps=25.0, device_memory_bytes=16 * 1024**3)
BALANCED = Candidate("pipeline", (("transform", "backbone"), ("rpn", "roi_heads")), (1, 1))
UNBALANCED = Candidate("pipeline", (("transform", "backbone", "rpn"), ("roi_heads",)), (1, 1))


def three_machines(devices: int = 0) -> object:
    return parse_topology(
        {
            "engine": "pipeline",
            "master": {"devices": 0},
            "workers": [
                {"devices": devices, "stage": "s1"},
                {"devices": devices, "stage": "s2"},
            ],
            "stages": [
                {"name": "s1", "modules": ["transform", "backbone"]},
                {"name": "s2", "modules": ["rpn", "roi_heads"]},
            ],
        }
    )


def test_balanced_split_is_preferred_to_an_unbalanced_one() -> None:
    meas = measurements(backbone=1.0, rpn=1.0, roi_heads=0.1)
    balanced, unbalanced = predict(meas, BALANCED, SETTING), predict(meas, UNBALANCED, SETTING)
    assert balanced.images_per_s > unbalanced.images_per_s
    assert rank([unbalanced, balanced])[0] is balanced


def test_replicas_reduce_the_time_of_the_stage_they_replicate() -> None:
    meas = measurements(backbone=0.5, rpn=0.2, roi_heads=2.0)
    one = predict(meas, BALANCED, SETTING)
    two = predict(meas, replace(BALANCED, replicas=(1, 2)), SETTING)
    assert two.stage_s[1] == pytest.approx(one.stage_s[1] / 2)
    assert two.stage_s[0] == pytest.approx(one.stage_s[0])
    assert two.step_s < one.step_s


def test_link_term_dominates_at_low_bandwidth() -> None:
    meas = measurements(backbone=1.0, rpn=0.5, roi_heads=1.0, feature_mb=30.0)
    fast = predict(meas, BALANCED, SETTING)
    slow = predict(meas, BALANCED, replace(SETTING, link_gbps=0.1))
    assert fast.link_s < 0.1 * fast.compute_s
    assert slow.link_s > slow.compute_s
    assert slow.compute_s == pytest.approx(fast.compute_s)
    # 4 micro-batches x (input 1 MB + 30 MB features forward + 30 MB gradients back) at 0.1 Gbit/s
    assert slow.link_s == pytest.approx(4 * 61 * MB / (0.1e9 / 8))


def test_a_candidate_that_does_not_fit_is_never_recommended() -> None:
    meas = measurements(backbone=1.0, rpn=0.2, roi_heads=1.0)
    topology = three_machines()
    roomy = rank([predict(meas, c, SETTING) for c in candidates(topology)])
    assert roomy[0].candidate.engine == "ddp"  # the fastest when memory is no object
    # Room for a stage's share of the model, not for the whole model (ddp, one-stage pipeline).
    tight = replace(SETTING, device_memory_bytes=roomy[0].memory_bytes - 1)
    ranked = rank([predict(meas, c, tight) for c in candidates(topology)])
    best = recommended(ranked)
    assert best is not None and best.fits and best.candidate.engine == "pipeline"
    assert all(p.fits for p in ranked[: ranked.index(best) + 1])
    assert ranked[0].images_per_s < roomy[0].images_per_s
    nothing = rank([predict(meas, c, replace(SETTING, device_memory_bytes=1)) for c in candidates(topology)])
    assert recommended(nothing) is None
    assert why(None, nothing).startswith("choose none")


def test_candidates_cover_ddp_every_runnable_split_and_replicas() -> None:
    found = candidates(three_machines(devices=2))
    assert found[0] == Candidate("ddp", devices=5)  # 1 CPU master + 2 workers x 2 GPUs
    splits = {c.stages for c in found if c.engine == "pipeline"}
    # 1 + 3 contiguous splits into at most 2 stages, minus the one whose first stage is `transform` alone
    assert len(splits) == 3
    assert all(("transform",) not in s for s in splits)
    assert {c.replicas for c in found if len(c.stages) == 2} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(("transform",) not in s for s in contiguous_splits(3))


THREE_STAGES = Candidate("pipeline", (("transform", "backbone"), ("rpn",), ("roi_heads",)), (1, 1, 1))
WHOLE = Candidate("pipeline", (("transform", "backbone", "rpn", "roi_heads"),), (1,))


@pytest.mark.parametrize("cand", [WHOLE, BALANCED, THREE_STAGES])
@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_pipeline_compute_is_the_gpipe_fill_and_drain_of_the_slowest_stage(cand: Candidate, micro_batches: int) -> None:
    """(M + S - 1) slots of the slowest stage; a slot is one micro-batch of B / M images."""
    meas = measurements(backbone=0.8, rpn=0.3, roi_heads=0.5)
    pred = predict(meas, cand, replace(SETTING, micro_batches=micro_batches))
    images = SETTING.batch / micro_batches  # per micro-batch; measured on 1 image
    stage_s = [images * sum(meas.module(n).forward_s + meas.module(n).backward_s for n in s) for s in cand.stages]
    assert pred.stage_s == pytest.approx(stage_s)
    assert pred.compute_s == pytest.approx((micro_batches + len(cand.stages) - 1) * max(stage_s))


@pytest.mark.parametrize(
    ("micro_batches", "replicas", "speedup"),
    [
        (4, 2, 2.0),  # two micro-batches each
        (1, 2, 1.0),  # one micro-batch: the second replica idles
        (3, 2, 1.5),  # the busiest replica runs two of the three
        (2, 4, 2.0),  # replicas beyond M idle
    ],
)
def test_replicas_gain_only_the_micro_batches_they_share(micro_batches: int, replicas: int, speedup: float) -> None:
    """The stage host deals micro-batch k to replica k % R: the stage takes ceil(M / R) micro-batch
    times, and its busiest replica's device holds that many micro-batches' activations."""
    meas = measurements(backbone=0.5, rpn=0.2, roi_heads=2.0)
    # Heavy RoI-head activations, so that the replicated stage's device is the most loaded one.
    heads = replace(meas.module("roi_heads"), activation_bytes=100 * MB)
    meas = replace(meas, modules=(*meas.modules[:3], heads))
    setting = replace(SETTING, micro_batches=micro_batches)
    one = predict(meas, BALANCED, setting)
    more = predict(meas, replace(BALANCED, replicas=(1, replicas)), setting)
    assert one.stage_s[1] / more.stage_s[1] == pytest.approx(speedup)
    waves = -(-micro_batches // replicas)
    images = SETTING.batch / micro_batches  # per micro-batch
    # weights, gradients and momentum + activations (per image: rpn 10 MB, roi_heads 100 MB)
    assert more.memory_bytes == pytest.approx(3 * (2 + 60) * MB + waves * images * 110 * MB, abs=1)


@pytest.mark.parametrize("processes", [1, 2, 3, 5])
def test_ddp_runs_the_batch_per_process_and_ring_all_reduces_the_gradients(processes: int) -> None:
    """--batch-size is per process under ddp (the loader gives each rank B images): N x B images
    per step, B images' activations per device, and 2 (N - 1) / N x gradient bytes per step."""
    meas = measurements(backbone=0.8, rpn=0.3, roi_heads=0.5)
    pred = predict(meas, Candidate("ddp", devices=processes), SETTING)
    grads = (50 + 2 + 60) * MB
    assert pred.link_s == pytest.approx(2 * (processes - 1) / processes * grads / SETTING.link_bytes_per_s)
    assert pred.compute_s == pytest.approx(SETTING.batch * 1.6)  # whole model, B images, measured on 1
    assert pred.images_per_step == processes * SETTING.batch
    assert pred.images_per_s == pytest.approx(processes * SETTING.batch / pred.step_s)
    assert pred.memory_bytes == 3 * grads + SETTING.batch * 4 * 10 * MB
