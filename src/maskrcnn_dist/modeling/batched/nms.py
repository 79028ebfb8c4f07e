"""Non-maximum suppression for a whole batch at once, with outputs of a fixed size.

torchvision's `nms` returns the kept indices, a tensor whose length only the device knows: the host
waits for it, once per image (the RPN calls it per image). Here every (image, level) group is a row of
one (G, n) batch, and the result is a (G, n) mask of the kept boxes.

Greedy NMS (visit boxes by falling score; keep one unless a kept box overlaps it more than the
threshold) keeps exactly the set K with: j in K  <=>  no i in K ranks before j and suppresses it.
K is the unique fixed point of  F(x)[j] = valid[j] and not any_i(x[i] and S[i, j]),  S the "ranks
before and overlaps" matrix, and iterating F from "all kept" reaches it: the best box is right after
one step, and every box is right one step after all the boxes that rank before it and overlap it
are. Each step is one batched matrix-vector product on the device. The host asks whether the
iteration has settled after as many steps as the longest run so far needed (`Settling`): one read for
the whole batch, as a rule; the result is exactly the greedy set, with no bound assumed on the chains
of boxes that suppress each other.

The overlaps are computed as torchvision's CPU kernel computes them (areas, then max/min, then
inter / (area_i + area_j - inter)); boxes of equal score are visited in index order (torchvision's
sort is unstable there, and its docs leave that order unspecified).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from .boxes import from_host

# The (group, n, n) overlap matrices are computed this many elements at a time (memory, not speed).
CHUNK_ELEMENTS = 1 << 24
STEPS_PER_CHECK = 8


def suppression(boxes: Tensor, valid: Tensor, iou_threshold: float) -> Tensor:
    """(G, n, n) bool: S[g, i, j] = box i comes before box j and overlaps it more than the threshold;
    `boxes` (G, n, 4) in visiting order, `valid` (G, n) the boxes taking part."""
    groups, n = valid.shape
    areas = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    later = torch.ones(n, n, dtype=torch.bool, device=boxes.device).triu(diagonal=1)
    per_chunk = max(1, CHUNK_ELEMENTS // max(n * n, 1))
    chunks = []
    for start in range(0, groups, per_chunk):
        b = boxes[start : start + per_chunk]
        a = areas[start : start + per_chunk]
        w = (torch.min(b[:, :, None, 2], b[:, None, :, 2]) - torch.max(b[:, :, None, 0], b[:, None, :, 0])).clamp(min=0)
        h = (torch.min(b[:, :, None, 3], b[:, None, :, 3]) - torch.max(b[:, :, None, 1], b[:, None, :, 1])).clamp(min=0)
        inter = w * h
        overlap = inter / (a[:, :, None] + a[:, None, :] - inter)
        v = valid[start : start + per_chunk]
        chunks.append((overlap > iou_threshold) & later & v[:, :, None] & v[:, None, :])
    return torch.cat(chunks) if len(chunks) > 1 else chunks[0]


@dataclass
class Settling:
    """How many fixed-point steps run before the host first asks whether they have settled: the most
    any call has needed so far (kept on the host by the caller, e.g. the RPN), so that after the first
    steps of training one read a call is the rule."""

    steps: int = STEPS_PER_CHECK


def greedy_fixed_point(suppress: Tensor, valid: Tensor, settling: Settling) -> Tensor:
    """(G, n) bool: the greedy kept set of each group, from its (G, n, n) suppression matrix."""
    # fp16 products on a GPU (exact for "> 0": the terms are 0 and 1, none negative); fp32 on a CPU.
    dtype = torch.float16 if suppress.device.type == "cuda" else torch.float32
    matrix = suppress.to(dtype)
    kept, taken = valid, 0
    while True:
        for _ in range(settling.steps):
            previous = kept
            kept = valid & ~(torch.bmm(kept.to(dtype)[:, None, :], matrix)[:, 0] > 0)
        taken += settling.steps
        if not bool((kept != previous).any()):  # the host read: has the iteration settled?
            settling.steps = max(settling.steps, taken)
            return kept


def batched_nms_mask(
    boxes: Tensor, scores: Tensor, valid: Tensor, iou_threshold: float, settling: Settling | None = None
) -> Tensor:
    """(G, n, 4), (G, n), (G, n) -> (G, n) bool: greedy NMS within each group, highest score first."""
    order = torch.sort(torch.where(valid, scores, float("-inf")), dim=1, descending=True, stable=True).indices
    ordered_boxes = boxes.gather(1, order[..., None].expand(-1, -1, 4))
    ordered_valid = valid.gather(1, order)
    suppress = suppression(ordered_boxes, ordered_valid, iou_threshold)
    kept = greedy_fixed_point(suppress, ordered_valid, settling or Settling())
    return torch.zeros_like(valid).scatter(1, order, kept)


def segment_nms_mask(
    boxes: Tensor,
    scores: Tensor,
    valid: Tensor,
    segments: list[int],
    iou_threshold: float,
    settling: Settling | None = None,
) -> Tensor:
    """(B, K, 4), (B, K), (B, K) -> (B, K) bool: NMS within each consecutive segment of K (the RPN's
    levels), separately per image; the segments' lengths `segments` sum to K."""
    batch, total = valid.shape
    longest = max(segments)
    to_groups, from_groups = segment_layout(tuple(segments))
    gather = from_host(to_groups, boxes)
    padded_valid = torch.cat((valid, valid.new_zeros(batch, 1)), dim=1)
    padded_boxes = torch.cat((boxes, boxes.new_zeros(batch, 1, 4)), dim=1)
    padded_scores = torch.cat((scores, scores.new_zeros(batch, 1)), dim=1)
    groups = batch * len(segments)
    kept = batched_nms_mask(
        padded_boxes[:, gather].reshape(groups, longest, 4),
        padded_scores[:, gather].reshape(groups, longest),
        padded_valid[:, gather].reshape(groups, longest),
        iou_threshold,
        settling,
    )
    return kept.reshape(batch, -1)[:, from_host(from_groups, boxes)]


@functools.lru_cache(maxsize=16)
def segment_layout(segments: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Host constants: for each entry of the (L, longest) groups, its position in K (K itself, an
    extra entry that takes part in nothing, for a segment's missing tail); and for each entry of K,
    its position among the groups' entries."""
    longest, total = max(segments), sum(segments)
    to_groups, from_groups, start = [], [], 0
    for level, count in enumerate(segments):
        to_groups += [start + j if j < count else total for j in range(longest)]
        from_groups += [level * longest + j for j in range(count)]
        start += count
    return torch.tensor(to_groups), torch.tensor(from_groups)
