"""Stage hosts in one process: the worker's registry, what every entry point returns (what crosses the wire),
and each replica's work on its own stream (streams recorded on CPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from maskrcnn_dist.engines.pipeline import guard, hosts
from maskrcnn_dist.engines.pipeline.host import StageHost
from maskrcnn_dist.engines.pipeline.stages import MicroBatchState

from .pipeline_procs import make_plans
from .pipeline_toy import NUM_CLASSES, make_batch, small_config
from .stream_recorder import CALLER, RecordingStreams


def placements(replicas: tuple[int, int] = (1, 1)):
    master, _ = make_plans(0, replicas=replicas)
    return tuple(replace(s, devices=("cpu",) * r) for s, r in zip(master.stages, replicas))


def train_round(host: StageHost, micro_batches: int, round_id: int = 1) -> list[MicroBatchState]:
    images, targets = make_batch(2 * micro_batches)
    return [
        host.forward(
            round_id, 0, k, MicroBatchState.from_inputs(images[2 * k : 2 * k + 2], targets[2 * k : 2 * k + 2]), "train"
        )
        for k in range(micro_batches)
    ]


def gradients(host: StageHost, outputs: list[MicroBatchState]) -> dict[torch.Tensor, torch.Tensor]:
    """What dist_autograd.get_gradients would give: parameter -> its gradient from these outputs."""
    total = sum(f.float().sum() for o in outputs for f in o.features.values())
    params = [p for r in host.replicas for p in r.trainable]
    return dict(zip(params, torch.autograd.grad(total, params, allow_unused=True), strict=True))


@pytest.mark.slow
def test_every_value_a_host_returns_crosses_a_device_map_agent() -> None:
    """What the master receives from a host (its description, a stage's output, norms, the step's report,
    the checkpoint part) passes the guard: TensorPipe's walk and the bound on plain bytes. The host itself
    does not: it holds locks (and must stay on its worker)."""
    cfg = small_config()
    first = StageHost(cfg, placements(), 0, NUM_CLASSES, iters_per_epoch=4)
    last = StageHost(cfg, placements(), 1, NUM_CLASSES, iters_per_epoch=4)
    images, targets = make_batch(2)
    middle = first.forward(1, 0, 0, MicroBatchState.from_inputs(images, targets), "train")
    out = last.forward(1, 0, 0, middle, "train")
    sum(out.losses.values()).backward()
    grads = {p: p.grad for host in (first, last) for r in host.replicas for p in r.trainable if p.grad is not None}
    returned = {
        "describe": first.describe(),
        "forward (train)": middle,
        "forward (last stage)": out,
        "norms": first.reduce_gradients(grads, want_norms=True),
        "report": first.apply_step(torch.tensor(0.5)),
        "state": last.state(),
        "forward (eval)": last.forward(
            2, 0, 0, first.forward(2, 0, 0, MicroBatchState.from_inputs(images, None), "eval"), "eval"
        ),
    }
    for name, value in returned.items():
        guard.check(value, guard.DEFAULT_MAX_PLAIN_BYTES)  # raises with the cause
        assert guard.plain_bytes(value) < guard.DEFAULT_MAX_PLAIN_BYTES / 4, name
    with pytest.raises(guard.DeviceMapGuardError, match="RLock|lock"):
        guard.check(first, None)


@pytest.mark.slow
def test_every_entry_point_runs_on_its_replicas_stream() -> None:
    streams = RecordingStreams()
    host = StageHost(small_config(), placements((2, 1)), 0, NUM_CLASSES, iters_per_epoch=4, streams=streams)
    for replica in host.replicas:
        replica.stage.register_forward_pre_hook(lambda *_: streams.mark("forward"))
        replica.optimizer.register_step_pre_hook(lambda *_: streams.mark("step"))
    built, streams.log[:] = list(streams.log), []
    # Building: each replica's copy to its device was queued on its own lane.
    assert [e for e in built if e[0] == "wait"] == [("wait", "lane0", CALLER), ("wait", "lane1", CALLER)]

    outputs = train_round(host, micro_batches=2)
    forwards = [e for e in streams.log if e[0] == "forward"]
    assert forwards == [("forward", "lane0"), ("forward", "lane1")]  # micro-batch k on replica k % 2, on its lane
    for lane in ("lane0", "lane1"):
        entry = streams.log.index(("wait", lane, CALLER))
        assert streams.log.index(("forward", lane)) > entry  # after what the request brought
        assert streams.log.index(("wait_event", CALLER, f"event@{lane}")) > streams.log.index(("forward", lane))

    streams.log[:] = []
    host.reduce_gradients(gradients(host, outputs), want_norms=True)
    # The sum on replica 0's lane waits for replica 1's; the copy back on replica 1's waits for the sum.
    assert streams.log.index(("wait", "lane0", "lane1")) < streams.log.index(("wait", "lane1", "lane0"))

    streams.log[:] = []
    host.apply_step(torch.tensor(1.0))
    assert [e for e in streams.log if e[0] == "step"] == [("step", "lane0"), ("step", "lane1")]

    streams.log[:] = []
    host.load(host.state()["model"], None, None)
    for lane in ("lane0", "lane1"):
        assert ("wait", lane, CALLER) in streams.log and ("wait_event", CALLER, f"event@{lane}") in streams.log


def test_the_registry_keeps_hosts_by_run_and_stage() -> None:
    cfg = small_config()
    described = hosts.create("run-a", 0, cfg, placements(), NUM_CLASSES, 4, "cpu")
    try:
        assert described["trainable"] > 0 and all(k.startswith("backbone.") for k in described["keys"])
        images, targets = make_batch(2)
        state = hosts.forward("run-a", 0, 1, 0, 0, MicroBatchState.from_inputs(images, targets), "eval")
        assert state.features is not None
        with pytest.raises(KeyError, match="no stage 1 of run run-b on this worker"):
            hosts.state("run-b", 0)  # another engine's run never reaches this one's host
        with pytest.raises(KeyError, match="exists on this worker already"):
            hosts.create("run-a", 0, cfg, placements(), NUM_CLASSES, 4, "cpu")
    finally:
        hosts.drop("run-a", 0)
    assert hosts.REGISTRY.keys() == []
    with pytest.raises(KeyError, match="no stage 1 of run run-a on this worker"):
        hosts.apply("run-a", 0, None)
