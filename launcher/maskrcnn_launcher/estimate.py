"""Estimated bytes per optimizer step on each link: a formula from the topology, not a measurement.

The trainer counts the real bytes; this estimate exists so a user can see before deploying that,
say, 2 images of 800x1333 move ~180 MB of FPN features per step from stage 1 to stage 2.

Assumptions (all from the topology's `estimate:` section):
* every image has the size `image_size` after the model's resize, padded to a multiple of 32
  (torchvision's transform pads the batch to a multiple of 32); raw inputs are assumed to have
  that size too;
* FPN features: 256 channels at strides 4, 8, 16, 32, plus the `pool` level (max-pool with
  stride 2 on the stride-32 level, i.e. ceil(n / 2)); 4 bytes per value in float32, 2 in bfloat16;
* targets: `instances_per_image` masks of H x W uint8, plus boxes (4 float32), label and iscrowd
  (int64), area (float32) per instance;
* RPN proposals: 2000 boxes per image (torchvision's post-NMS top-n in training), float32, and
  detached (no gradient flows back through them);
* Mask R-CNN's 5 training losses are float32 scalars;
* ddp: ring all-reduce of float32 gradients sends 2 (N - 1) / N x parameters x 4 bytes per process.

Bytes are per step (the whole batch); messages per step is the number of micro-batches on a stage's
edges (each crosses by value, forward and back), one for the losses (ddp: the number of gradient buckets).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from maskrcnn_launcher.contract import StagePlacement
from maskrcnn_launcher.topology import Estimate, Topology

FPN_CHANNELS = 256
FPN_STRIDES = (4, 8, 16, 32)
PROPOSALS_PER_IMAGE = 2000
LOSSES = 5
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
DDP_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class LinkEstimate:
    """Estimated traffic of one directed link per optimizer step (a formula, not a measurement).

    Launcher-only: `plan` prints it for the job before anything is deployed; the trainer counts
    the real bytes and never reads this."""

    src: str  # rpc name of the sender
    dst: str  # rpc name of the receiver ("ring" for ddp's all-reduce)
    carries: str  # what travels, e.g. "features + targets"
    phase: str  # "forward" or "backward"
    messages_per_step: int
    bytes_per_step: int


def padded_size(estimate: Estimate) -> tuple[int, int]:
    h, w = estimate.image_size
    return 32 * math.ceil(h / 32), 32 * math.ceil(w / 32)


def image_bytes(estimate: Estimate) -> int:
    h, w = padded_size(estimate)
    return 3 * h * w * 4  # float32 in [0, 1]


def target_bytes(estimate: Estimate) -> int:
    h, w = padded_size(estimate)
    per_instance = h * w + 4 * 4 + 8 + 8 + 4  # mask uint8, box, label, iscrowd, area
    return estimate.instances_per_image * per_instance + 8  # + image_id


def feature_values(estimate: Estimate) -> int:
    """Values in one image's FPN feature maps: levels '0'..'3' and 'pool'."""
    h, w = padded_size(estimate)
    sizes = [(math.ceil(h / s), math.ceil(w / s)) for s in FPN_STRIDES]
    last_h, last_w = sizes[-1]
    sizes.append((math.ceil(last_h / 2), math.ceil(last_w / 2)))  # max_pool2d(kernel 1, stride 2)
    return FPN_CHANNELS * sum(a * b for a, b in sizes)


def feature_bytes(estimate: Estimate) -> int:
    return feature_values(estimate) * DTYPE_BYTES[estimate.feature_dtype]


def boundary(last_module: str, estimate: Estimate) -> tuple[str, int, str, int]:
    """(what, bytes per image forward, what flows back, bytes per image backward) after `last_module`."""
    targets = target_bytes(estimate)
    if last_module == "transform":
        # The normalised, padded batch: the transform has no parameters, so no gradient flows back.
        return "images + targets (resized)", image_bytes(estimate) + targets, "", 0
    if last_module == "backbone":
        return (
            "features + targets",
            feature_bytes(estimate) + targets,
            "feature gradients",
            feature_bytes(estimate),
        )
    if last_module == "rpn":
        proposals = PROPOSALS_PER_IMAGE * 4 * 4
        return (
            "features + proposals + targets",
            feature_bytes(estimate) + proposals + targets,
            "feature gradients",
            feature_bytes(estimate),
        )
    raise ValueError(f"no stage boundary after {last_module!r}")


def pipeline_links(topology: Topology, stages: Sequence[StagePlacement]) -> list[LinkEstimate]:
    est = topology.estimate
    n, mb = est.batch_size, est.micro_batches
    links = [
        LinkEstimate(
            "master",
            stages[0].rpc_name,
            "images + targets",
            "forward",
            mb,
            n * (image_bytes(est) + target_bytes(est)),
        )
    ]
    for prev, nxt in zip(stages, stages[1:], strict=False):
        what, fwd, back_what, back = boundary(prev.modules[-1], est)
        links.append(LinkEstimate(prev.rpc_name, nxt.rpc_name, what, "forward", mb, n * fwd))
        if back:
            links.append(LinkEstimate(nxt.rpc_name, prev.rpc_name, back_what, "backward", mb, n * back))
    # The last stage backpropagates from its own losses; their values reach the master once per step,
    # with the step's gradient reduction (no gradient travels from the master).
    links.append(LinkEstimate(stages[-1].rpc_name, "master", "losses", "backward", 1, mb * LOSSES * 4))
    return links


def ddp_links(topology: Topology, rpc_names: Sequence[str]) -> list[LinkEstimate]:
    est = topology.estimate
    world = topology.world_size
    per_process = 0 if world == 1 else 2 * (world - 1) * est.model_parameters * 4 // world
    # DDP all-reduces gradients in buckets of 25 MiB (its default bucket_cap_mb): one call each.
    buckets = math.ceil(est.model_parameters * 4 / DDP_BUCKET_BYTES)
    return [
        LinkEstimate(name, "ring", "gradient all-reduce", "backward", buckets, max(devices, 1) * per_process)
        for name, devices in zip(rpc_names, topology.node_devices(), strict=True)
    ]
