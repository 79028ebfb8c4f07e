"""Single-process pieces of the pipeline engine: batching, loss reduction, optimizer layout, transport."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict

import pytest
import torch
from maskrcnn_launcher.contract import StagePlacement
from torch import nn

from maskrcnn_dist.config import OptimConfig
from maskrcnn_dist.engines.pipeline import split_batch, weighted_mean
from maskrcnn_dist.engines.pipeline.rounds import Turnstile
from maskrcnn_dist.engines.pipeline.stages import MicroBatchState
from maskrcnn_dist.engines.pipeline.state import checksum, merge_optimizer_states, split_optimizer_state
from maskrcnn_dist.engines.pipeline.transport import (
    HOST,
    Activation,
    Route,
    attach,
    cut,
    from_wire,
    gradient_bytes,
    route_for,
    send_gradients,
    to_wire,
    wire_bytes,
)
from maskrcnn_dist.modeling.optim import build_optimizer


def test_split_batch_is_contiguous_and_balanced() -> None:
    images = [torch.zeros(1)] * 5
    parts = split_batch(images, list(range(5)), 2)
    assert [len(i) for i, _ in parts] == [2, 3] or [len(i) for i, _ in parts] == [3, 2]
    assert [t for _, ts in parts for t in ts] == list(range(5))
    assert len(split_batch(images[:1], None, 4)) == 1  # never an empty micro-batch


def test_weighted_mean_weights_by_images() -> None:
    mean = weighted_mean([{"a": torch.tensor(1.0)}, {"a": torch.tensor(4.0)}], [1, 3])
    assert float(mean["a"]) == 3.25


@pytest.mark.slow
def test_stage_optimizer_states_merge_into_the_whole_models_layout() -> None:
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    whole[0].bias.requires_grad_(False)  # frozen parameters are not in the optimizer
    split = copy.deepcopy(whole)
    cfg = OptimConfig(lr=0.1)
    stages = [nn.Sequential(split[0]), nn.Sequential(split[1])]
    reference = build_optimizer(whole, cfg)
    per_stage = [build_optimizer(s, cfg) for s in stages]
    for model, optimizers in ((whole, [reference]), (split, per_stage)):
        model(torch.ones(2, 3)).sum().backward()
        for opt in optimizers:
            opt.step()
    merged = merge_optimizer_states([o.state_dict() for o in per_stage])
    expected = reference.state_dict()
    assert merged["param_groups"] == expected["param_groups"]
    assert merged["state"].keys() == expected["state"].keys()
    for index, value in expected["state"].items():
        assert checksum(merged["state"][index].values()) == checksum(value.values())
    for part, opt in zip(split_optimizer_state(expected, [1, 2]), per_stage):
        opt.load_state_dict(part)  # and back: the shapes fit each stage's parameters


def test_bf16_transport_halves_feature_bytes_and_keeps_autograd() -> None:
    feature = torch.randn(2, 8, 4, 4, requires_grad=True)
    state = MicroBatchState(original_image_sizes=[(4, 4)] * 2, features=OrderedDict([("0", feature * 1)]))
    full = wire_bytes(state)
    sent = to_wire(state, bf16_features=True, route=HOST)
    assert wire_bytes(sent) == full // 2 and gradient_bytes(sent) == full // 2
    received = from_wire(sent, torch.device("cpu"))
    assert received.features["0"].dtype == torch.float32
    received.features["0"].sum().backward()
    assert feature.grad is not None and torch.equal(feature.grad, torch.ones_like(feature))


def test_an_empty_device_tensor_crosses_as_an_empty_host_tensor() -> None:
    """TensorPipe aborts the sender of an empty CUDA tensor (pytorch/tensorpipe#447): under device maps an
    image without objects has empty targets. ("meta" stands in for a device here: it holds no data.)"""
    empty, full = torch.empty(0, 4, device="meta"), torch.empty(2, 4, device="meta")
    state = MicroBatchState(original_image_sizes=[(4, 4)], targets=[{"boxes": empty, "masks": full}])
    sent = to_wire(state, bf16_features=False, route=Route("meta"))
    boxes, masks = sent.targets[0]["boxes"], sent.targets[0]["masks"]
    assert (boxes.device.type, boxes.shape, boxes.dtype) == ("cpu", (0, 4), torch.float32)
    assert masks.device.type == "meta"  # a tensor with elements stays where device maps move it
    received = from_wire(sent, torch.device("meta"))
    assert received.targets[0]["boxes"].device.type == "meta"


def test_turnstile_refuses_an_abandoned_round_and_says_when_a_round_is_done() -> None:
    gate = Turnstile()
    with gate.turn(1, 0):
        pass
    assert not gate.wait_past(1, 2, timeout=0.01) and gate.wait_past(1, 1, timeout=0.01)
    with gate.turn(2, 0):  # round 1 abandoned after its first op
        pass
    with pytest.raises(RuntimeError, match="round 1 was abandoned: round 2 has begun"), gate.turn(1, 1):
        pass
    assert gate.wait_past(1, 5, timeout=0.01) and gate.wait_past(3, 0, timeout=0.01)


def test_turnstile_lets_calls_through_in_order() -> None:
    gate, seen = Turnstile(), []

    def call(round_id: int, index: int) -> None:
        with gate.turn(round_id, index):
            seen.append((round_id, index))

    for round_id in (1, 2):
        threads = [threading.Thread(target=call, args=(round_id, i)) for i in (3, 1, 2, 0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
    assert seen == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1), (2, 2), (2, 3)]


def test_master_with_a_bad_data_path_fails_before_any_worker_joins(tmp_path, monkeypatch) -> None:
    """The data is loaded before RPC: the master's own error names the path, and no worker is ever
    drawn into a session that would end for them as "master lost"."""
    from maskrcnn_dist.config import TrainConfig
    from maskrcnn_dist.engines.pipeline import runtime
    from maskrcnn_dist.errors import DatasetError
    from maskrcnn_dist.train import train

    from .pipeline_procs import make_plans

    def no_rpc(*args, **kwargs):
        raise AssertionError("the master joined RPC before its data was known to load")

    monkeypatch.setattr(runtime, "join_rpc", no_rpc)
    master, _ = make_plans(port=29999)
    cfg = TrainConfig(engine="pipeline", output_dir=tmp_path / "out")
    cfg.data.data_path = tmp_path / "no-such-data"
    with pytest.raises(DatasetError, match="no-such-data"):
        train(cfg, master)


def test_an_activation_crosses_by_value_and_its_gradients_come_back_in_order() -> None:
    """The sender keeps what wants a gradient (features, a loss term), with its graph; the receiver gets
    detached copies, makes those leaves, and their gradients drive the sender's backward. Integer
    tensors, targets and detached proposals carry no gradient either way."""
    weight = torch.tensor(2.0, requires_grad=True)
    features = OrderedDict([("0", torch.ones(1, 2, 2, 2) * weight), ("pool", torch.ones(1, 2, 1, 1) * weight)])
    state = MicroBatchState(
        original_image_sizes=[(4, 4)],
        targets=[{"boxes": torch.zeros(1, 4), "labels": torch.ones(1, dtype=torch.int64)}],
        features=features,
        proposals=[torch.rand(3, 4)],
        losses={"loss_objectness": weight * 3},
    )
    sent, outputs = cut(state, train=True)
    assert [o.shape for o in outputs] == [(1, 2, 2, 2), (1, 2, 1, 1), ()] and all(o.grad_fn for o in outputs)
    assert not any(t.requires_grad for t in sent.state.targets[0].values())
    received, leaves = attach(sent)
    assert [leaf.shape for leaf in leaves] == [o.shape for o in outputs]
    assert all(leaf.is_leaf and leaf.requires_grad for leaf in leaves)
    assert received.features["0"] is leaves[0] and received.losses["loss_objectness"] is leaves[2]
    (received.features["0"].sum() + received.losses["loss_objectness"] * 5).backward()
    grads = send_gradients([leaf.grad for leaf in leaves], HOST)
    assert grads[1] is None  # "pool" was not used: no gradient, nothing to send
    torch.autograd.backward([o for o, g in zip(outputs, grads) if g is not None], [g for g in grads if g is not None])
    assert float(weight.grad) == 8 * 1 + 5 * 3
    assert cut(state, train=False)[0].wants_grad == () and Activation.of_inputs([], None).wants_grad == ()


def _placements(*devices: tuple[str, ...]) -> tuple[StagePlacement, ...]:
    return tuple(
        StagePlacement(i + 1, f"stage{i + 1}", i, i + 1, f"worker{i + 1}", (f"m{i}",), d) for i, d in enumerate(devices)
    )


@pytest.mark.parametrize(
    ("sender", "receiver", "transport", "expected"),
    [
        # GPU to GPU: each replica leaves from its own device, where the map covers it.
        (("cuda:0", "cuda:1"), ("cuda:0", "cuda:1"), "device_maps", ["cuda:0", "cuda:1"]),
        # More replicas than the receiver has: the uncovered one leaves through a covered device of its worker.
        (("cuda:0", "cuda:1"), ("cuda:0",), "device_maps", ["cuda:0", "cuda:0"]),
        (("cuda:0", "cuda:1", "cuda:2"), ("cuda:0", "cuda:1"), "auto", ["cuda:0", "cuda:1", "cuda:0"]),
        # transport cpu, or a CPU end: host memory.
        (("cuda:0",), ("cuda:0",), "cpu", [None]),
        (("cuda:0",), ("cpu",), "device_maps", [None]),
        (("cpu", "cpu"), ("cuda:0",), "device_maps", [None, None]),
    ],
)
def test_each_replica_leaves_from_a_device_the_callers_map_covers(sender, receiver, transport, expected) -> None:
    from maskrcnn_launcher.contract import edge_device_map

    mapping = edge_device_map(transport, sender, receiver)
    assert [route_for(mapping, device).via for device in sender] == expected
    assert set(mapping) <= set(sender) and len(set(mapping.values())) == len(mapping)  # one-to-one


def test_a_host_routes_activations_forward_and_gradients_back() -> None:
    """Stage 2 of three: activations to stage 3 by its map, gradients to stage 1 by the other one."""
    from maskrcnn_launcher.contract import edge_device_map

    placements = _placements(("cuda:0",), ("cuda:0", "cuda:1"), ("cpu",))
    forward = edge_device_map("device_maps", placements[1].devices, placements[2].devices)
    backward = edge_device_map("device_maps", placements[1].devices, placements[0].devices)
    assert forward == {} and backward == {"cuda:0": "cuda:0"}
    assert [route_for(backward, d).via for d in placements[1].devices] == ["cuda:0", "cuda:0"]
