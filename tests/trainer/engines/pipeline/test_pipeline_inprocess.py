"""The pipeline engine with its stages in this process (inprocess.py: every call on a thread, by value,
under the device-map guard's walk): stage-by-stage backward against the local engine bit for bit, 1F1B
against GPipe bit for bit, the order each stage ran, fp16's loss scale across stages, the checkpoint."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from maskrcnn_dist.engines.base import read_losses
from maskrcnn_dist.engines.pipeline.scaler import LossScaler
from maskrcnn_dist.engines.pipeline.schedule import replica_ops, stage_ops
from maskrcnn_dist.engines.torch_engine import TorchEngine

from ...conftest import TEST_ROIS
from ..reference import local_accumulating
from . import inprocess
from .pipeline_toy import NUM_CLASSES, make_batch, small_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

THREE_STAGES = (("transform", "backbone"), ("rpn",), ("roi_heads",))


def train(engine, steps: int, batch) -> list[dict[str, float]]:
    return [read_losses(engine.train_step(step, *batch)) for step in range(steps)]


def assert_bitwise(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    different = [k for k in expected if not torch.equal(got[k], expected[k])]
    assert different == [], different[:5]


def test_m1_equals_the_local_engine_bit_for_bit() -> None:
    """Stage 2 backpropagates from its loss into the features it received (leaves), stage 1 from their
    gradients: the same sums in the same order as one process's backward (a stage that dropped or
    zeroed its incoming gradient would leave the backbone's gradients out)."""
    cfg, batch = small_config(micro_batches=1), make_batch(2)
    local = TorchEngine(replace(cfg, engine="local"), NUM_CLASSES, iters_per_epoch=10)
    pipe = inprocess.engine(cfg)
    assert train(pipe, 2, batch) == train(local, 2, batch)
    assert_bitwise(pipe.state_dict()["model"], local.state_dict()["model"])


def test_m4_equals_the_accumulation_reference() -> None:
    """Within summation order: the reference backpropagates the weighted sum once, the stages each weighted
    micro-batch's loss. A step's weights agree to 1.5e-8; a random model from scratch grows that 100-fold
    in the step after it, so the weights are compared after one step, the losses of the step after too."""
    cfg, batch = small_config(micro_batches=4), make_batch(4)
    expected_losses, expected = local_accumulating(cfg, 2, batch, 4, NUM_CLASSES, state_after=1)
    pipe = inprocess.engine(cfg)
    losses = train(pipe, 1, batch)
    got = pipe.state_dict()["model"]
    for key in expected["model"]:
        torch.testing.assert_close(got[key].float(), expected["model"][key].float(), rtol=1e-5, atol=1e-7, msg=key)
    losses.append(read_losses(pipe.train_step(1, *batch)))
    for got_terms, want in zip(losses, expected_losses, strict=True):
        assert got_terms.keys() == want.keys()
        for name in want:
            assert got_terms[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), name


@pytest.fixture(scope="module")
def schedules() -> dict[str, dict]:
    """Three stages (the RPN's losses cross to stage 3 and their gradients come back), two replicas of the
    middle one, four micro-batches, one step (its weights and momenta decide every later one), under each
    schedule."""
    runs = {}
    for schedule in ("gpipe", "1f1b"):
        cfg = small_config(micro_batches=4, pipeline_schedule=schedule)
        engine = inprocess.engine(cfg, replicas=(1, 2, 1), placement=THREE_STAGES)
        losses = train(engine, 1, make_batch(4))
        runs[schedule] = {
            "losses": losses,
            "state": inprocess.weights_and_momenta(engine),
            "ran": [host.rounds.current.log for host in engine.stage_hosts],
            "ops": [host.rounds.current.ops for host in engine.stage_hosts],
            "metrics": engine.extra_metrics(),
        }
    return runs


def test_1f1b_equals_gpipe_bit_for_bit(schedules) -> None:
    assert schedules["1f1b"]["losses"] == schedules["gpipe"]["losses"]
    assert_bitwise(schedules["1f1b"]["state"], schedules["gpipe"]["state"])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_each_replica_ran_its_schedule_in_order(schedules, schedule: str) -> None:
    """What each replica ran, in the order it ran it, is its share of torch's schedule for its stage (a
    backward run early, before its turn, would show here), and 1F1B held at most (stages - s) micro-batches
    per stage where GPipe held all four."""
    run = schedules[schedule]
    for s, (ran, replicas) in enumerate(zip(run["ran"], (1, 2, 1), strict=True)):
        expected = stage_ops(schedule, 3, s, 4, train=True)
        for r in range(replicas):
            assert tuple(op for replica, op in ran if replica == r) == replica_ops(expected, replicas, r), (s, r)
        held = run["metrics"][f"stage{s + 1}/peak_in_flight"]
        assert held == (min(4, 3 - s) if schedule == "1f1b" else 4), (schedule, s)


def test_replicas_stay_identical(schedules) -> None:
    state = schedules["1f1b"]["state"]
    replica0 = {k.split("/", 2)[2]: v for k, v in state.items() if k.startswith("stage2/r0/")}
    replica1 = {k.split("/", 2)[2]: v for k, v in state.items() if k.startswith("stage2/r1/")}
    assert replica0 and replica0.keys() == replica1.keys()
    assert_bitwise(replica1, replica0)


# -- fp16 -------------------------------------------------------------------------------------------------


def fp16(cfg, size: int = 48):
    """fp16 autocast in every stage at `size` px and 32 RoIs an image (fp16 runs 10-25x slower than fp32 on a
    CPU: the smallest size whose deepest feature map still has more than one value per channel for BatchNorm
    in one image; trainer/conftest.py's TEST_ROIS); on the CPU only a library caller gets it (device "cpu",
    as here)."""
    model = replace(cfg.model, min_size=size, max_size=size, box_batch_size_per_image=TEST_ROIS)
    return replace(cfg, amp=True, amp_dtype="float16", model=model)


def start_scale(scaler, scale: float) -> None:
    """From 2^16 a random model's first fp16 steps overflow: start where they do not."""
    scaler.load_state_dict({**scaler.state_dict(), "scale": scale})


def params_and_momenta(state: dict[str, torch.Tensor], pipe) -> dict[str, torch.Tensor]:
    names = {n for host in pipe.stage_hosts for r in host.replicas for n, _ in r.stage.named_parameters()}
    return {k: v for k, v in state.items() if "momentum" in k or k.split("/", 2)[2] in names}


def test_fp16_steps_equal_the_local_engines_scaled_steps() -> None:
    """The last stage scales its loss, every stage unscales by the same inverse before the clipping and the
    step: the local engine's GradScaler arithmetic, bit for bit (one stage that skipped its unscale would
    step 256 times too far, or be clipped by a norm 256 times too large)."""
    cfg, batch = fp16(small_config(micro_batches=1)), make_batch(1, size=64)
    local = TorchEngine(replace(cfg, engine="local"), NUM_CLASSES, iters_per_epoch=10)
    pipe = inprocess.engine(cfg)
    assert pipe.skips_expected and pipe.scaler.scale == local.scaler.get_scale() == 2.0**16
    for scaler in (pipe.scaler, local.scaler):
        start_scale(scaler, 256.0)
    assert train(pipe, 1, batch) == train(local, 1, batch)
    assert [bool(pipe.skipped())] == [bool(local.skipped())] == [False]
    assert_bitwise(pipe.state_dict()["model"], local.state_dict()["model"])
    assert pipe.state_dict()["scaler"] == local.state_dict()["scaler"]


def test_fp16_overflow_skips_the_step_on_every_stage_and_replica() -> None:
    """From the start (momenta zeros, as build_optimizer makes them): an overflow anywhere changes no
    weight and no momentum on any stage or replica; a step that went through would have moved both."""
    cfg, batch = fp16(small_config(micro_batches=2)), make_batch(2, size=64)
    pipe = inprocess.engine(cfg, replicas=(2, 1))
    before = params_and_momenta(inprocess.weights_and_momenta(pipe), pipe)
    start_scale(pipe.scaler, 3.0e38)  # the scaled loss overflows fp32: every gradient is inf
    losses = read_losses(pipe.train_step(0, *batch))
    assert bool(pipe.skipped()) and all(v == v and abs(v) < float("inf") for v in losses.values())
    after = params_and_momenta(inprocess.weights_and_momenta(pipe), pipe)
    assert {k.split("/")[0] for k in before} == {"stage1", "stage2"} and any("/r1/" in k for k in before)
    assert_bitwise(after, before)
    assert pipe.scaler.scale == pytest.approx(1.5e38)
    assert pipe.state_dict()["scaler"]["scale"] == pytest.approx(1.5e38)


@pytest.mark.parametrize("stage", [0, 1])
def test_an_inf_on_one_stage_only_skips_the_step_on_every_stage(stage: int) -> None:
    """One parameter's gradient on one replica of one stage turns inf (a hook: nothing upstream or
    downstream sees it): that stage's check alone finds it, and no weight or momentum moves anywhere."""
    cfg, batch = small_config(micro_batches=2), make_batch(2)
    pipe = inprocess.engine(cfg, replicas=(2, 1))
    replica = pipe.stage_hosts[stage].replicas[-1]
    replica.trainable[-1].register_hook(lambda grad: torch.full_like(grad, float("inf")))
    before = params_and_momenta(inprocess.weights_and_momenta(pipe), pipe)
    losses = read_losses(pipe.train_step(0, *batch))
    assert bool(pipe.skipped()) and all(abs(v) < float("inf") for v in losses.values())
    assert_bitwise(params_and_momenta(inprocess.weights_and_momenta(pipe), pipe), before)


def test_a_non_finite_loss_skips_the_step_where_gradients_stay_finite(monkeypatch) -> None:
    """A loss term that is nan while backward still gives finite gradients (a nan constant added to it)
    never updates a weight: the last stage folds its loss's finiteness into the step's check."""
    cfg, batch = small_config(micro_batches=1), make_batch(2)
    pipe = inprocess.engine(cfg)
    host = pipe.stage_hosts[-1]
    answer = host._answer

    def poisoned(r, round_, ticket, state, leaves):
        state.losses["loss_classifier"] = state.losses["loss_classifier"] + torch.tensor(float("nan"))
        return answer(r, round_, ticket, state, leaves)

    monkeypatch.setattr(host, "_answer", poisoned)
    before = params_and_momenta(inprocess.weights_and_momenta(pipe), pipe)
    losses = read_losses(pipe.train_step(0, *batch))
    assert bool(pipe.skipped()) and losses["loss_classifier"] != losses["loss_classifier"]  # nan
    assert_bitwise(params_and_momenta(inprocess.weights_and_momenta(pipe), pipe), before)


def test_the_loss_scale_follows_gradscaler() -> None:
    """LossScaler's updates are GradScaler("cpu")'s for the same overflows, and its state dict is one."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=2)
    ours = LossScaler(enabled=True, init_scale=4.0, growth_interval=2)
    for overflow in (False, False, True, False, False, False, True, True):
        optimizer.zero_grad()
        loss = model(torch.ones(1, 2)).sum() * (float("inf") if overflow else 1.0)
        reference.scale(loss).backward()
        reference.step(optimizer)
        reference.update()
        ours.update(found_inf=overflow)
        assert ours.state_dict() == reference.state_dict()
        assert ours.inv_scale == float(reference._scale.double().reciprocal().float())
    off = LossScaler(enabled=False)
    off.update(found_inf=True)
    assert (off.scale, off.state_dict()) == (1.0, {})


def test_the_checkpoint_carries_the_scale_and_older_checkpoints_resume() -> None:
    cfg = fp16(small_config(micro_batches=1))
    pipe = inprocess.engine(cfg)
    start_scale(pipe.scaler, 512.0)
    saved = pipe.state_dict()
    assert saved["scaler"]["scale"] == 512.0
    # A pipeline checkpoint from before fp16 ran in its stages kept an empty scaler: fp16 starts afresh.
    fresh = inprocess.engine(cfg)
    fresh.load_state_dict({**saved, "scaler": {}})
    assert fresh.scaler.scale == 2.0**16
    fresh.load_state_dict(saved)
    assert fresh.scaler.scale == 512.0
    # The local engine's fp16 checkpoint carries its scale into the pipeline, and back.
    local = TorchEngine(replace(cfg, engine="local"), NUM_CLASSES, iters_per_epoch=10)
    start_scale(local.scaler, 1024.0)
    fresh.load_state_dict(local.state_dict())
    assert fresh.scaler.scale == 1024.0
    local.load_state_dict(saved)
    assert local.scaler.get_scale() == 512.0
