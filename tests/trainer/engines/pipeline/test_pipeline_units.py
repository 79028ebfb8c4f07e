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
from maskrcnn_dist.engines.pipeline.host import Turnstile
from maskrcnn_dist.engines.pipeline.stages import MicroBatchState
from maskrcnn_dist.engines.pipeline.state import checksum, merge_optimizer_states, split_optimizer_state
from maskrcnn_dist.engines.pipeline.transport import (
    from_wire,
    gradient_bytes,
    sends_device_tensors,
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
    sent = to_wire(state, bf16_features=True, to_cpu=True)
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
    sent = to_wire(state, bf16_features=False, to_cpu=False)
    boxes, masks = sent.targets[0]["boxes"], sent.targets[0]["masks"]
    assert (boxes.device.type, boxes.shape, boxes.dtype) == ("cpu", (0, 4), torch.float32)
    assert masks.device.type == "meta"  # a tensor with elements stays where device maps move it
    received = from_wire(sent, torch.device("meta"))
    assert received.targets[0]["boxes"].device.type == "meta"


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


def _placements(*devices: tuple[str, ...]) -> tuple[StagePlacement, ...]:
    return tuple(
        StagePlacement(i + 1, f"stage{i + 1}", i, i + 1, f"worker{i + 1}", (f"m{i}",), d) for i, d in enumerate(devices)
    )


@pytest.mark.parametrize(
    ("devices", "transport", "expected"),
    [
        # A GPU stage before a CPU stage: the CPU side has no map, so stage 1 stages through host memory.
        ((("cuda:0",), ("cpu",)), "device_maps", [set(), set()]),
        # GPU to GPU under device maps: stage 1 sends device tensors; the last stage answers the CPU master.
        ((("cuda:0",), ("cuda:0", "cuda:1")), "device_maps", [{"cuda:0"}, set()]),
        # The same GPUs without the opt-in: host memory.
        ((("cuda:0",), ("cuda:0",)), "cpu", [set(), set()]),
        # CPU before GPU: CPU tensors need no map; GPU -> CPU -> GPU: only what the receiver maps.
        ((("cpu",), ("cuda:0",)), "device_maps", [set(), set()]),
        ((("cuda:0",), ("cuda:0",), ("cpu",), ("cuda:0",)), "device_maps", [{"cuda:0"}, set(), set(), set()]),
        # Replicas beyond what the next stage maps (refused by the topology; never sent unmapped here).
        ((("cuda:0", "cuda:1"), ("cuda:0",)), "device_maps", [{"cuda:0"}, set()]),
    ],
)
def test_device_tensors_cross_an_edge_only_where_the_receiver_maps_them(devices, transport, expected) -> None:
    placements = _placements(*devices)
    assert [set(sends_device_tensors(placements, i, transport)) for i in range(len(placements))] == expected
