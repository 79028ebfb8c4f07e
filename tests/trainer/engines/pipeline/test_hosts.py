"""Stage hosts in one process: the worker's registry, what every entry point returns and sends (what crosses
the wire), and each replica's work on its own stream (streams recorded on CPU)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from maskrcnn_dist.engines.pipeline import guard, hosts
from maskrcnn_dist.engines.pipeline.host import StageHost, completed
from maskrcnn_dist.engines.pipeline.rounds import Ticket
from maskrcnn_dist.engines.pipeline.schedule import BACKWARD, FORWARD, Op
from maskrcnn_dist.engines.pipeline.transport import Activation, tensors_in

from .inprocess import LocalLinks, placements
from .pipeline_toy import NUM_CLASSES, make_batch, small_config
from .stream_recorder import CALLER, RecordingStreams


def inputs(micro: int, per_micro: int = 2, seed: int = 0) -> Activation:
    images, targets = make_batch(per_micro * (micro + 1), seed=seed)
    return Activation.of_inputs(images[-per_micro:], targets[-per_micro:])


@pytest.mark.slow
def test_every_value_a_host_returns_or_sends_crosses_a_device_map_agent() -> None:
    """What crosses from a host (its description, the activations and gradients it sends, the step's
    reduction and report, the checkpoint part, an evaluation's answer) passes the guard: TensorPipe's walk
    and the bound on plain bytes (LocalLinks walks what the stages send each other). The host itself does
    not: it holds locks (and must stay on its worker)."""
    cfg = small_config()
    pair: list[StageHost] = []
    pair += [StageHost(cfg, placements(), i, NUM_CLASSES, 4, links=LocalLinks(pair, i)) for i in range(2)]
    first, last = pair
    train = Ticket(1, 0, 0, 1, "train")
    returned = {"describe": first.describe(), "forward (train)": first.forward(train, inputs(0)).wait()}
    returned["reduce (last stage)"] = last.reduce(1, 1.0, True)
    returned["reduce"] = first.reduce(1, 1.0, True)
    returned["report"] = first.apply(1, torch.tensor(0.5), False)
    last.apply(1, torch.tensor(0.5), False)
    returned["state"] = last.state()
    returned["forward (eval)"] = first.forward(Ticket(2, 0, 0, 1, "eval"), inputs(0)).wait()
    assert returned["forward (train)"] is None and returned["forward (eval)"].detections is not None
    assert returned["reduce"]["losses"] == [] and set(returned["reduce (last stage)"]["losses"][0]) == {
        "loss_classifier",
        "loss_box_reg",
        "loss_mask",
        "loss_objectness",
        "loss_rpn_box_reg",
    }
    for name, value in returned.items():
        guard.check(value, guard.DEFAULT_MAX_PLAIN_BYTES)  # raises with the cause
        assert guard.plain_bytes(value) < guard.DEFAULT_MAX_PLAIN_BYTES / 4, name
        assert all(t.device.type == "cpu" for t in tensors_in(value)), name  # the master has no GPU
    with pytest.raises(guard.DeviceMapGuardError, match="RLock|lock"):
        guard.check(first, None)


class Captured:
    """The first stage's links, stubbed: what it sends forward is kept, nothing goes back."""

    def __init__(self) -> None:
        self.sent: dict[int, Activation] = {}

    def forward(self, ticket: Ticket, activation: Activation) -> torch.futures.Future:
        self.sent[ticket.micro] = activation
        return completed(None)

    def backward(self, ticket, grads) -> torch.futures.Future:
        raise AssertionError("the first stage sends no gradient back")


@pytest.mark.slow
def test_every_entry_point_runs_on_its_replicas_stream() -> None:
    streams, links = RecordingStreams(), Captured()
    host = StageHost(small_config(), placements((2, 1)), 0, NUM_CLASSES, 4, streams=streams, links=links)
    for replica in host.replicas:
        replica.stage.register_forward_pre_hook(lambda *_: streams.mark("forward"))
        replica.optimizer.register_step_pre_hook(lambda *_: streams.mark("step"))
    built, streams.log[:] = list(streams.log), []
    # Building: each replica's copy to its device was queued on its own lane.
    assert [e for e in built if e[0] == "wait"] == [("wait", "lane0", CALLER), ("wait", "lane1", CALLER)]

    tickets = [Ticket(1, 0, k, 2, "train", "gpipe") for k in range(2)]
    for ticket in tickets:
        host.forward(ticket, inputs(ticket.micro)).wait()
    forwards = [e for e in streams.log if e[0] == "forward"]
    assert forwards == [("forward", "lane0"), ("forward", "lane1")]  # micro-batch k on replica k % 2, on its lane
    for lane in ("lane0", "lane1"):
        entry = streams.log.index(("wait", lane, CALLER))
        assert streams.log.index(("forward", lane)) > entry  # after what the request brought
        assert streams.log.index(("wait_event", CALLER, f"event@{lane}")) > streams.log.index(("forward", lane))

    streams.log[:] = []
    for ticket in tickets:  # the gradients of what each micro-batch sent, from "stage 2"
        sent = links.sent[ticket.micro]
        wanted = [tensors_in(sent.state)[i] for i in sent.wants_grad]
        host.backward(ticket, [torch.ones_like(t) for t in wanted])
    assert [e[1] for e in streams.log if e[0] == "wait" and e[2] == CALLER] == ["lane0", "lane1"]
    assert all(r.trainable[0].grad is not None for r in host.replicas)

    streams.log[:] = []
    host.reduce(1, 1.0, want_norms=True)
    # The sum on replica 0's lane waits for replica 1's; the copy back on replica 1's waits for the sum.
    assert streams.log.index(("wait", "lane0", "lane1")) < streams.log.index(("wait", "lane1", "lane0"))

    streams.log[:] = []
    host.apply(1, torch.tensor(1.0), False)
    assert [e for e in streams.log if e[0] == "step"] == [("step", "lane0"), ("step", "lane1")]

    streams.log[:] = []
    host.load(host.state()["model"], None, None)
    for lane in ("lane0", "lane1"):
        assert ("wait", lane, CALLER) in streams.log and ("wait_event", CALLER, f"event@{lane}") in streams.log


def test_a_backward_that_arrives_before_its_turn_waits_for_it() -> None:
    """1F1B on stage 1 of 2 at M=4 runs F0 F1 B0 F2 ...: B0's gradients, come after F0 only, wait at the
    replica's turnstile (seen waiting there before anything of B0 ran) and run after F1."""
    links = Captured()
    host = StageHost(small_config(), placements(), 0, NUM_CLASSES, 4, links=links)
    tickets = [Ticket(1, 0, k, 4, "train", "1f1b") for k in range(4)]
    host.forward(tickets[0], inputs(0)).wait()
    cond, waiting = host.replicas[0].turnstile._cond, threading.Event()
    wait_for = cond.wait_for

    def seen_waiting(predicate, timeout=None):
        waiting.set()
        return wait_for(predicate, timeout)

    cond.wait_for = seen_waiting
    sent = links.sent[0]
    grads = [torch.ones_like(tensors_in(sent.state)[i]) for i in sent.wants_grad]
    backward = threading.Thread(target=host.backward, args=(tickets[0], grads))
    backward.start()
    try:
        assert waiting.wait(60), "the backward never reached the turnstile"
        assert host.rounds.current.log == [(0, Op(FORWARD, 0))]
    finally:
        host.forward(tickets[1], inputs(1)).wait()
        backward.join(60)
    assert host.rounds.current.log == [(0, Op(FORWARD, 0)), (0, Op(FORWARD, 1)), (0, Op(BACKWARD, 0))]


def test_the_registry_keeps_hosts_by_run_and_stage() -> None:
    cfg = small_config()
    described = hosts.create("run-a", 0, cfg, placements(), NUM_CLASSES, 4, "cpu")
    try:
        assert described["trainable"] > 0 and all(k.startswith("backbone.") for k in described["keys"])
        assert described["fp16"] is False
        assert hosts.state("run-a", 0)["checksums"]
        with pytest.raises(KeyError, match="no stage 1 of run run-b on this worker"):
            hosts.state("run-b", 0)  # another engine's run never reaches this one's host
        with pytest.raises(KeyError, match="exists on this worker already"):
            hosts.create("run-a", 0, cfg, placements(), NUM_CLASSES, 4, "cpu")
        # An async_execution function answers with a future, failed if the host is not there.
        with pytest.raises(KeyError, match="no stage 2 of run run-a"):
            hosts.forward("run-a", 1, Ticket(1, 0, 0, 1, "eval"), inputs(0)).wait()
    finally:
        hosts.drop("run-a", 0)
    assert hosts.REGISTRY.keys() == []
    with pytest.raises(KeyError, match="no stage 1 of run run-a on this worker"):
        hosts.apply("run-a", 0, 1, None, False)


def test_a_step_of_a_stage_whose_backward_never_came_names_what_is_missing() -> None:
    cfg = replace(small_config(), peers=replace(small_config().peers, timeout=0.5))
    links = Captured()
    host = StageHost(cfg, placements(), 0, NUM_CLASSES, 4, links=links)
    host.forward(Ticket(1, 0, 0, 1, "train"), inputs(0)).wait()
    with pytest.raises(RuntimeError, match=r"stage 1, replica 0: only 1 of its 2 ops ran within 0.5s \(next: "):
        host.reduce(1, 1.0, False)
